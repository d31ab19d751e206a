// Kept responses (`store`, the default) through two clients nobody here wrote, each as its docs use it for a
// conversation: the `openai` package chaining three turns by `previous_response_id` only, and the AI SDK's
// `@ai-sdk/openai` (its default model: the Responses API) with `generateText` and its default options, which
// send the earlier assistant turn as an `item_reference`.
//
// Usage: node responses_kept.mjs CONFIG.json, CONFIG = {"base": URL ending in /v1, "model"}. Prints one JSON
// array: per client the texts of its turns, or the error it raised.

import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { generateText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const results = [];

async function attempt(name, body) {
  const result = { name };
  try {
    result.texts = await body();
  } catch (error) {
    result.error = String(error?.message ?? error);
  }
  results.push(result);
}

await attempt('openai', async () => {
  const client = new OpenAI({ baseURL: config.base, apiKey: 'not-checked-on-loopback', maxRetries: 0 });
  const texts = [];
  let previous;
  for (const input of ['My name is Ada.', 'What is my name?', 'Say it again.']) {
    const response = await client.responses.create({ model: config.model, input, previous_response_id: previous });
    texts.push(response.output_text);
    previous = response.id;
  }
  return texts;
});

await attempt('ai_sdk', async () => {
  const openai = createOpenAI({ baseURL: config.base, apiKey: 'not-checked-on-loopback' });
  const messages = [{ role: 'user', content: 'My name is Ada.' }];
  const first = await generateText({ model: openai(config.model), messages, maxRetries: 0 });
  messages.push(...first.response.messages, { role: 'user', content: 'What is my name?' });
  const second = await generateText({ model: openai(config.model), messages, maxRetries: 0 });
  return [first.text, second.text];
});

process.stdout.write(JSON.stringify(results));
