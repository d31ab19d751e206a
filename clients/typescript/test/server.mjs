// Starts the agentmux binary (AGENTMUX_BIN, or the repository's target/debug/agentmux) on a loopback port
// the system picks, in memory only, and reads back where it listens.

import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export const repository = fileURLToPath(new URL('../../../', import.meta.url));

export async function startServer(args = []) {
  const binary = process.env.AGENTMUX_BIN ?? `${repository}target/debug/agentmux`;
  if (!existsSync(binary)) throw new Error(`no agentmux at ${binary}: run cargo build (or set AGENTMUX_BIN)`);
  const child = spawn(binary, ['serve', '--addr', '127.0.0.1:0', '--ephemeral', ...args], {
    env: { ...process.env, RUST_LOG: 'info', NO_COLOR: '1' },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  const lines = createInterface({ input: child.stderr });
  const address = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('agentmux did not say where it listens')), 30_000);
    lines.on('line', (line) => {
      const match = line.match(/agentmux listening.*address=(\S+)/);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
    child.on('exit', (code) => reject(new Error(`agentmux exited with ${code}`)));
  });
  return {
    baseUrl: `http://${address}`,
    stop: () =>
      new Promise((resolve) => {
        child.once('exit', resolve);
        child.kill('SIGTERM');
      }),
  };
}
