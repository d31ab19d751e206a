// The client in headless Chromium (Debian's `chromium`, driven by puppeteer-core), against real agentmux
// processes: the page, on an origin of its own, imports the client from the service
// (`/ui/assets/client.js`, the module a page without a build step uses) and runs every scenario of
// scenarios.mjs (but the one it says Node alone runs, and why) across origins, CORS preflights included (`Authorization`, `Last-Event-ID`).

import { readFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import http from 'node:http';
import { after, before, test } from 'node:test';
import { fileURLToPath } from 'node:url';

import puppeteer from 'puppeteer-core';

import { startEnvironment } from './environment.mjs';
import { nodeOnly, scenarios } from './scenarios.mjs';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const files = {
  '/': [here('browser/index.html'), 'text/html; charset=utf-8'],
  '/harness.mjs': [here('browser/harness.mjs'), 'text/javascript'],
  '/scenarios.mjs': [here('scenarios.mjs'), 'text/javascript'],
};

let page;
let browser;
let site;
let environment;
let origin;
const problems = [];

before(async () => {
  if (!existsSync(CHROMIUM)) throw new Error(`Chromium is needed at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM)`);
  site = http.createServer(async (request, response) => {
    const file = files[new URL(request.url, 'http://page').pathname];
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

test('in Chromium: the page ran on an origin of its own', async () => {
  const pageOrigin = await page.evaluate(() => window.location.origin);
  if (pageOrigin === new URL(environment.env.plain).origin) throw new Error('the page shares the service origin');
});
