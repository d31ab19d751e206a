// Builds what agentmux embeds under /ui/assets: the viewer (src/http/api/ui/viewer.js and viewer.css: the
// sources in src/, the TypeScript client from ../typescript/src, and the pinned packages, marked for Markdown
// and DOMPurify to make it inert, bundled by esbuild into one ES module), and the TypeScript client alone
// (src/http/api/ui/client.js, one ES module with its SSE parser inside), which a page imports without a build
// step of its own. `--check` builds in memory and exits 1 when the committed files differ (the tests run
// it), so the bundles in the repository are always what these sources give.

import { readFile, writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

const here = (path) => fileURLToPath(new URL(path, import.meta.url));
const out = {
  js: here('../../src/http/api/ui/viewer.js'),
  css: here('../../src/http/api/ui/viewer.css'),
  client: here('../../src/http/api/ui/client.js'),
};

const bundle = async (entry) => {
  const result = await esbuild.build({
    entryPoints: [entry],
    bundle: true,
    format: 'esm',
    target: 'es2022',
    minify: true,
    write: false,
    charset: 'utf8',
    legalComments: 'eof',
    // The client's one dependency, from here: the bundle does not depend on what else is installed.
    alias: { 'eventsource-parser': here('node_modules/eventsource-parser/dist/index.js') },
    logLevel: 'error',
  });
  return result.outputFiles[0].text;
};
const js = await bundle(here('src/viewer.ts'));
const client = await bundle(here('../typescript/src/index.ts'));
const css = await readFile(here('src/viewer.css'), 'utf8');

if (process.argv.includes('--check')) {
  const stale = [];
  for (const [path, text] of [[out.js, js], [out.css, css], [out.client, client]]) {
    if ((await readFile(path, 'utf8').catch(() => '')) !== text) stale.push(path);
  }
  if (stale.length > 0) {
    console.error(`not what the sources build: ${stale.join(', ')} (run npm run build in clients/viewer)`);
    process.exit(1);
  }
} else {
  await writeFile(out.js, js);
  await writeFile(out.css, css);
  await writeFile(out.client, client);
}
