// What the scenarios run against, for Node and for Chromium alike: an agentmux in memory, a proxy in front of
// it that drops one event stream mid-event, another that drops the first append's answer after the append
// landed, an agentmux with an API key, and one whose ended streams go after
// a short retention (for a watcher left behind). Browsers reach them from the page's origin, which each
// agentmux lists with --cors-origin.

import { startCuttingProxy } from './proxy.mjs';
import { startServer } from './server.mjs';

export const KEY = 'sk-typescript-test';
export const RETENTION_MS = 3000;

export async function startEnvironment({ corsOrigin } = {}) {
  const cors = corsOrigin ? ['--cors-origin', corsOrigin] : [];
  const plain = await startServer(cors);
  const keyed = await startServer([...cors, '--api-key', KEY]);
  const retention = await startServer([...cors, '--retention', `${RETENTION_MS}ms`]);
  const { hostname, port } = new URL(plain.baseUrl);
  // Stream sequences 1 to 9 go through whole, then the connection drops after the `id:` line of the tenth.
  const proxy = await startCuttingProxy({ host: hostname, port: Number(port) }, '\nid: 10\n');
  // The first answer to hold `"last_sequence"` (an append's: the scenario sends nothing else through it) is
  // cut in the middle of its body.
  const lostAnswer = await startCuttingProxy({ host: hostname, port: Number(port) }, '"last_sequence"');
  return {
    env: {
      plain: plain.baseUrl,
      cut: proxy.baseUrl,
      lostAnswer: lostAnswer.baseUrl,
      keyed: { baseUrl: keyed.baseUrl, key: KEY },
      retention: { baseUrl: retention.baseUrl, ms: RETENTION_MS },
    },
    proxy,
    stop: async () => {
      await proxy.stop();
      await lostAnswer.stop();
      await Promise.all([plain.stop(), keyed.stop(), retention.stop()]);
    },
  };
}
