// The client against real agentmux processes, in Node: every scenario of scenarios.mjs (a watcher cut
// mid-stream resumes exactly once; a read token reads and cannot write; a cancel and an end are seen; an
// abort stops the connection; a chat run is watched to its end; a watcher left behind gets a LaggedError; a
// changed epoch is an EpochChangedError). browser.test.mjs runs the same ones in Chromium.

import { after, before, test } from 'node:test';

import * as lib from '../dist/index.js';
import { startEnvironment } from './environment.mjs';
import { scenarios } from './scenarios.mjs';

let environment;
before(async () => {
  environment = await startEnvironment();
});
after(async () => environment?.stop());

for (const [name, scenario] of Object.entries(scenarios)) {
  test(name, () => scenario({ ...environment.env, lib }));
}
