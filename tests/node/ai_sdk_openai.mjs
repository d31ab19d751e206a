// The AI SDK's OpenAI provider (`@ai-sdk/openai`, its default model: the Responses API) with the `ai` package,
// against agentmux's `/v1/responses`, as its docs use it: `generateText` and `streamText`.
//
// Usage: node ai_sdk_openai.mjs CONFIG.json, CONFIG = {"base": URL ending in /v1, "runs": [{"name", "model",
// "stream": bool}]}. Prints one JSON array: per run its text, finish reason, and the error the SDK raised or
// put in the stream (its message), if any.

import { readFileSync } from 'node:fs';
import { generateText, streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const openai = createOpenAI({ baseURL: config.base, apiKey: 'not-checked-on-loopback' });
const results = [];

for (const run of config.runs) {
  const result = { name: run.name };
  const model = openai(run.model);
  try {
    if (run.stream) {
      const errors = [];
      const stream = streamText({ model, prompt: 'hello from the AI SDK', maxRetries: 0, onError: ({ error }) => errors.push(error) });
      for await (const part of stream.fullStream) {
        if (part.type === 'error') errors.push(part.error);
      }
      result.text = await stream.text.catch(() => null);
      result.finishReason = await stream.finishReason.catch(() => null);
      if (errors.length > 0) result.error = String(errors[0]?.message ?? errors[0]);
    } else {
      const answer = await generateText({ model, prompt: 'hello from the AI SDK', maxRetries: 0 });
      result.text = answer.text;
      result.finishReason = answer.finishReason;
    }
  } catch (error) {
    result.error = String(error?.message ?? error);
  }
  results.push(result);
}
process.stdout.write(JSON.stringify(results));
