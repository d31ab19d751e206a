// Watches one stream in every format at once, each through the client library made for it, the way each
// client reads its own endpoint's answer (each library's `fetch` is pointed at the stream's events in its
// format): the `ai` package (`DefaultChatTransport` + `readUIMessageStream`), `@ag-ui/client`'s `HttpAgent`,
// `@anthropic-ai/sdk` (`messages.stream().finalMessage()`), the `openai` package's Responses stream
// (`finalResponse()`) and its chat completions stream, and the typed messages (CUI) read as plain SSE.
//
// Usage: node watch_all.mjs CONFIG.json, CONFIG = {"events": URL of /v1/streams/{id}/events}. Prints one JSON
// object: for each format, the text its library assembled (or the error it threw).

import { HttpAgent } from '@ag-ui/client';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { events, lastUiMessage, reading, report } from './watching.mjs';

const texts = {
  'ui-message': async () => {
    const message = await lastUiMessage();
    return message.parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  },
  'ag-ui': async () => {
    const agent = new HttpAgent({ url: 'http://127.0.0.1:9/not-used', fetch: reading('ag-ui') });
    await agent.runAgent({});
    return agent.messages.filter((m) => m.role === 'assistant').map((m) => m.content ?? '').join('');
  },
  anthropic: async () => {
    const client = new Anthropic({ apiKey: 'x', baseURL: 'http://127.0.0.1:9', maxRetries: 0, fetch: reading('anthropic') });
    const message = await client.messages.stream({ model: 'm', max_tokens: 1, messages: [] }).finalMessage();
    return message.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  },
  responses: async () => {
    const client = new OpenAI({ apiKey: 'x', baseURL: 'http://127.0.0.1:9/v1', maxRetries: 0, fetch: reading('responses') });
    const response = await client.responses.stream({ model: 'm', input: '' }).finalResponse();
    return response.output_text;
  },
  openai: async () => {
    const client = new OpenAI({ apiKey: 'x', baseURL: 'http://127.0.0.1:9/v1', maxRetries: 0, fetch: reading('openai') });
    const stream = await client.chat.completions.create({ model: 'm', messages: [], stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    return text;
  },
  cui: async () => {
    const body = await (await fetch(events('cui'))).text();
    const messages = body
      .split('\n\n')
      .flatMap((event) => event.split('\n').filter((line) => line.startsWith('data: ')))
      .map((line) => JSON.parse(line.slice(6)));
    return messages.filter((m) => m.type === 'text').map((m) => m.props.content).join('');
  },
};

await report(
  Object.fromEntries(Object.entries(texts).map(([format, read]) => [format, async () => ({ text: await read() })])),
);
