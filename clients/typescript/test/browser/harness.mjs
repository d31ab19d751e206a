// The page's side of browser.test.mjs: runs one scenario on request, with the client module the service
// serves (`/ui/assets/client.js`), imported from the service's origin as any page would.

import { scenarios } from './scenarios.mjs';

window.runScenario = async (name, env) => {
  const lib = await import(env.clientUrl);
  await scenarios[name]({ ...env, lib });
  return 'passed';
};
window.harnessReady = true;
