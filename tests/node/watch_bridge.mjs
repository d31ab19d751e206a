// Watches one stream that a framework bridge publishes, at once through three client libraries, each the way
// it reads its own endpoint's answer (its `fetch` pointed at the stream's events in its format): the `ai`
// package (`DefaultChatTransport` + `readUIMessageStream`), `@ag-ui/client`'s `HttpAgent`, and the `openai`
// package's chat completions stream. Unlike `watch_all.mjs`, which compares text only, each reports what its
// library assembled of an agent's run: text, tool calls with their arguments and results, steps and custom
// events, so a test can check that a bridge's tool calls and handoffs reached every client.
//
// Usage: node watch_bridge.mjs CONFIG.json, CONFIG = {"events": URL of /v1/streams/{id}/events}. Prints one
// JSON object: for each format, what its library assembled (or the error it threw).

import { HttpAgent } from '@ag-ui/client';
import OpenAI from 'openai';
import { lastUiMessage, reading, report } from './watching.mjs';

const watchers = {
  'ui-message': async () => {
    const message = await lastUiMessage();
    const parts = message.parts;
    return {
      text: parts.filter((p) => p.type === 'text').map((p) => p.text).join(''),
      reasoning: parts.filter((p) => p.type === 'reasoning').map((p) => p.text).join(''),
      tools: parts
        .filter((p) => p.type === 'dynamic-tool' || p.type.startsWith('tool-'))
        .map((p) => ({
          id: p.toolCallId,
          name: p.toolName ?? p.type.slice('tool-'.length),
          input: p.input,
          output: p.output,
          error: p.errorText,
          state: p.state,
        })),
      steps: parts.filter((p) => p.type === 'step-start').length,
    };
  },
  'ag-ui': async () => {
    const agent = new HttpAgent({ url: 'http://127.0.0.1:9/not-used', fetch: reading('ag-ui') });
    const steps = [];
    const custom = [];
    let finished = false;
    await agent.runAgent(
      {},
      {
        onStepStartedEvent: ({ event }) => {
          steps.push(event.stepName);
        },
        onCustomEvent: ({ event }) => {
          custom.push({ name: event.name, value: event.value });
        },
        onRunFinishedEvent: () => {
          finished = true;
        },
      },
    );
    const assistant = agent.messages.filter((m) => m.role === 'assistant');
    return {
      text: assistant.map((m) => m.content ?? '').join(''),
      toolCalls: assistant.flatMap((m) =>
        (m.toolCalls ?? []).map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments })),
      ),
      toolResults: agent.messages
        .filter((m) => m.role === 'tool')
        .map((m) => ({ toolCallId: m.toolCallId, content: m.content })),
      steps,
      custom,
      finished,
    };
  },
  openai: async () => {
    const client = new OpenAI({
      apiKey: 'x',
      baseURL: 'http://127.0.0.1:9/v1',
      maxRetries: 0,
      fetch: reading('openai'),
    });
    const stream = await client.chat.completions.create({ model: 'm', messages: [], stream: true });
    let text = '';
    let reasoning = '';
    let finishReason = null;
    for await (const chunk of stream) {
      const choice = chunk.choices[0];
      text += choice?.delta?.content ?? '';
      reasoning += choice?.delta?.reasoning_content ?? '';
      finishReason = choice?.finish_reason ?? finishReason;
    }
    return { text, reasoning, finishReason };
  },
};

await report(watchers);
