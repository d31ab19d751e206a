// The AI SDK's Anthropic provider (`@ai-sdk/anthropic`) with the `ai` package, against agentmux's
// `/v1/messages`, as its docs use it: `generateText` and `streamText`.
//
// Usage: node ai_sdk_anthropic.mjs CONFIG.json, CONFIG = {"base": URL ending in /v1, "runs": [{"name", "model",
// "stream": bool, "headers"?}]}. Prints one JSON array: per run its text, finish reason, usage (input and output
// tokens as the SDK counts them), and the error the SDK raised or put in the stream (its message, and for an HTTP
// error its status and the run's names from the headers), if any.

import { readFileSync } from 'node:fs';
import { generateText, streamText } from 'ai';
import { createAnthropic } from '@ai-sdk/anthropic';

const config = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const anthropic = createAnthropic({ baseURL: config.base, apiKey: 'not-checked-on-loopback' });
const results = [];

// What a person (or a program) sees of an error: its message, and what came with an HTTP one.
function describe(error) {
  const cause = error?.lastError ?? error;
  const headers = cause?.responseHeaders ?? {};
  return {
    message: String(cause?.message ?? cause),
    status: cause?.statusCode ?? null,
    streamId: headers['x-agentmux-stream-id'] ?? null,
    readToken: headers['x-agentmux-read-token'] ?? null,
  };
}

function tokens(usage) {
  return usage ? { input: usage.inputTokens ?? null, output: usage.outputTokens ?? null } : null;
}

for (const run of config.runs) {
  const result = { name: run.name };
  const model = anthropic(run.model);
  const prompt = 'hello from the AI SDK';
  const headers = run.headers ?? {};
  try {
    if (run.stream) {
      const errors = [];
      const stream = streamText({ model, prompt, headers, maxRetries: 0, onError: ({ error }) => errors.push(error) });
      for await (const part of stream.fullStream) {
        if (part.type === 'error') errors.push(part.error);
      }
      result.text = await stream.text.catch(() => null);
      result.finishReason = await stream.finishReason.catch(() => null);
      result.usage = tokens(await stream.usage.catch(() => null));
      if (errors.length > 0) result.error = describe(errors[0]);
    } else {
      const answer = await generateText({ model, prompt, headers, maxRetries: 0 });
      result.text = answer.text;
      result.finishReason = answer.finishReason;
      result.usage = tokens(answer.usage);
    }
  } catch (error) {
    result.error = describe(error);
  }
  results.push(result);
}
process.stdout.write(JSON.stringify(results));
