// The page's side of browser.test.mjs's React test, bundled by esbuild with React (in its development
// build, so StrictMode mounts each effect twice): mounts a component that shows a run through `useStream`,
// and unmounts it on request.

import { createElement, StrictMode } from 'react';
import { createRoot } from 'react-dom/client';

import { createClient } from '../../dist/index.js';
import { useStream } from '../../dist/react.js';

function Run({ client, id, token }) {
  const { state, error, done } = useStream(client, id, { token });
  const text = state ? state.messages.filter((m) => m.type === 'text').map((m) => m.props.content).join('') : '';
  return createElement(
    'div',
    { id: 'run', 'data-done': String(done), 'data-status': state?.status ?? '', 'data-error': error?.message ?? '' },
    text,
  );
}

let root;
window.mountRun = (baseUrl, id, token) => {
  const client = createClient({ baseUrl });
  const element = document.createElement('div');
  document.body.append(element);
  root = createRoot(element);
  root.render(createElement(StrictMode, null, createElement(Run, { client, id, token })));
  return true;
};
window.unmountRun = () => {
  root.unmount();
  return true;
};
