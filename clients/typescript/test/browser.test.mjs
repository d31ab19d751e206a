// The client in headless Chromium (Debian's `chromium`, driven by puppeteer-core), against real agentmux
// processes: the page, on an origin of its own, imports the client from the service
// (`/ui/assets/client.js`, the module a page without a build step uses) and runs every scenario of
// scenarios.mjs (but the one it says Node alone runs, and why) across origins, CORS preflights included (`Authorization`, `Last-Event-ID`).

import { readFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import http from 'node:http';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import * as esbuild from 'esbuild';
import puppeteer from 'puppeteer-core';

import { createClient } from '../dist/index.js';

import { startEnvironment } from './environment.mjs';
import { nodeOnly, scenarios } from './scenarios.mjs';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const files = {
  '/': [here('browser/index.html'), 'text/html; charset=utf-8'],
  '/harness.mjs': [here('browser/harness.mjs'), 'text/javascript'],
  '/scenarios.mjs': [here('scenarios.mjs'), 'text/javascript'],
};

/** The React test's page script: the harness, React and the package's build, in one module. */
async function reactBundle() {
  const result = await esbuild.build({
    entryPoints: [here('browser/react-harness.mjs')],
    bundle: true,
    format: 'esm',
    write: false,
    define: { 'process.env.NODE_ENV': '"development"' },
    logLevel: 'error',
  });
  return result.outputFiles[0].text;
}

let page;
let browser;
let site;
let environment;
let origin;
const problems = [];

before(async () => {
  if (!existsSync(CHROMIUM)) throw new Error(`Chromium is needed at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM)`);
  const react = await reactBundle();
  site = http.createServer(async (request, response) => {
    const path = new URL(request.url, 'http://page').pathname;
    if (path === '/react.js') return response.writeHead(200, { 'content-type': 'text/javascript' }).end(react);
    const file = files[path];
    if (!file) return response.writeHead(404).end();
    response.writeHead(200, { 'content-type': file[1] }).end(await readFile(file[0]));
  });
  await new Promise((resolve) => site.listen(0, '127.0.0.1', resolve));
  origin = `http://127.0.0.1:${site.address().port}`;
  environment = await startEnvironment({ corsOrigin: origin });
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    // Nothing outside loopback, ever.
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1'],
  });
  page = await browser.newPage();
  page.on('pageerror', (error) => problems.push(`page error: ${error.message}`));
  await page.goto(`${origin}/`);
  await page.waitForFunction(() => window.harnessReady === true, { timeout: 20_000 });
});

after(async () => {
  await browser?.close();
  await environment?.stop();
  await new Promise((resolve) => (site ? site.close(resolve) : resolve()));
});

for (const name of Object.keys(scenarios).filter((n) => !nodeOnly.has(n))) {
  test(`in Chromium: ${name}`, async () => {
    const env = { ...environment.env, clientUrl: `${environment.env.plain}/ui/assets/client.js` };
    const result = await page.evaluate((n, e) => window.runScenario(n, e), name, env);
    if (result !== 'passed' || problems.length > 0) throw new Error(`${result}; ${problems.join('; ')}`);
  });
}

/** The subscribers gauge for CUI over SSE on the service at `baseUrl`. */
async function subscribers(baseUrl) {
  const metrics = await (await fetch(`${baseUrl}/metrics`)).text();
  const line = metrics.split('\n').find((l) => l.startsWith('agentmux_subscribers{') && l.includes('format="cui"') && l.includes('transport="sse"'));
  return line ? Number(line.split(' ').at(-1)) : 0;
}

async function until(check, what) {
  for (let i = 0; i < 200; i++) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`never: ${what}`);
}

test('in Chromium: the React hook shows a run live and closes its connection when unmounted', async () => {
  const { plain } = environment.env;
  const producer = createClient({ baseUrl: plain });
  const stream = await producer.createStream();
  const before = await subscribers(plain);
  await page.addScriptTag({ url: `${origin}/react.js`, type: 'module' });
  await page.waitForFunction(() => typeof window.mountRun === 'function');
  await page.evaluate((b, id, token) => window.mountRun(b, id, token), plain, stream.id, stream.read_token);
  const shown = () => page.$eval('#run', (n) => ({ text: n.textContent, done: n.dataset.done, status: n.dataset.status, error: n.dataset.error })).catch(() => null);
  for (const word of ['Hello', ', ', 'world']) {
    await producer.append(stream.id, [{ type: 'text', props: { content: word }, message_id: 'm', delta: true }], { writeToken: stream.write_token });
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  await until(async () => (await shown())?.text === 'Hello, world', 'the text shown whole');
  // StrictMode mounted the effect twice: the first watch was closed, one connection is left.
  await until(async () => (await subscribers(plain)) === before + 1, 'one subscriber while mounted');
  await producer.end(stream.id, undefined, { writeToken: stream.write_token });
  await until(async () => (await shown())?.done === 'true', 'the end seen');
  const last = await shown();
  if (last.status !== 'completed' || last.error !== '') throw new Error(`the run's end: ${JSON.stringify(last)}`);
  // A second stream, left open, then the component unmounted: its connection closes.
  const open = await producer.createStream();
  await page.evaluate(() => window.unmountRun());
  await page.evaluate((b, id, token) => window.mountRun(b, id, token), plain, open.id, open.read_token);
  await until(async () => (await subscribers(plain)) === before + 1, 'watching the open stream');
  await page.evaluate(() => window.unmountRun());
  await until(async () => (await subscribers(plain)) === before, 'the connection closed on unmount');
  await producer.end(open.id, undefined, { writeToken: open.write_token });
  if (problems.length > 0) throw new Error(problems.join('; '));
});

test('in Chromium: the page ran on an origin of its own', async () => {
  const pageOrigin = await page.evaluate(() => window.location.origin);
  if (pageOrigin === new URL(environment.env.plain).origin) throw new Error('the page shares the service origin');
});
