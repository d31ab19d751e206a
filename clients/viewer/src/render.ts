// One message as a person expects to see it: Markdown text, thinking folded away, a loading line that
// resolves, a tool call with its arguments as they stream and its result, an error, media inline, a file as a
// link, custom types as JSON. Lifecycle events and actions go to the timeline (`timeline`).

import type { OutputMessage } from '../../typescript/src/index.js';
import { el, json, markdown, safeUrl } from './safe.js';

type Props = Record<string, unknown>;
const text = (value: unknown) => (typeof value === 'string' ? value : value === undefined ? '' : JSON.stringify(value));

/** The node of a conversation message; `null` for what belongs to the timeline. */
export function render(message: OutputMessage): HTMLElement | null {
  const props = (message.props ?? {}) as Props;
  const node = el('div', `message ${message.type}`);
  node.dataset.type = message.type ?? '';
  if (message.message_id) node.dataset.messageId = message.message_id;
  switch (message.type) {
    case 'text':
      node.append(markdown(text(props.content)));
      break;
    case 'thinking': {
      const details = el('details', 'thinking');
      details.append(el('summary', undefined, 'Thinking'), el('div', 'thinking-text', text(props.content)));
      node.append(details);
      break;
    }
    case 'loading':
      node.append(el('span', 'spinner'), el('span', 'loading-text', text(props.message)));
      break;
    case 'tool_call': {
      node.dataset.callId = text(props.id);
      node.append(el('div', 'tool-name', `🔧 ${text(props.name)}`), el('pre', 'tool-arguments', text(props.arguments)));
      node.append(el('div', 'tool-result pending', 'running…'));
      break;
    }
    case 'tool_result': {
      node.dataset.callId = text(props.call_id);
      node.append(result(props));
      break;
    }
    case 'error':
      node.append(el('strong', undefined, 'Error'), el('span', 'error-text', ` ${text(props.message)}`));
      if (props.code) node.append(el('code', 'error-code', text(props.code)));
      break;
    case 'image': {
      const url = safeUrl(props.url, 'image');
      if (url) {
        const image = el('img');
        image.src = url;
        image.alt = text(props.alt);
        node.append(image);
      } else node.append(el('span', 'blocked', 'an image at an address this page does not load'));
      break;
    }
    case 'audio':
    case 'video': {
      const url = safeUrl(props.url, message.type);
      if (url) {
        const media = el(message.type);
        media.controls = true;
        media.src = url;
        node.append(media);
      } else node.append(el('span', 'blocked', `${message.type} at an address this page does not load`));
      break;
    }
    case 'file': {
      const url = safeUrl(props.url, 'link');
      const name = text(props.name) || text(props.url);
      if (url) {
        const link = el('a', 'file-link', `📄 ${name}`);
        link.href = url;
        link.target = '_blank';
        link.rel = 'noopener noreferrer nofollow';
        node.append(link);
      } else node.append(el('span', 'blocked', `📄 ${name}`));
      break;
    }
    case 'event':
    case 'action':
      return null;
    default:
      node.append(el('div', 'custom-type', message.type ?? ''), json(props));
  }
  return node;
}

/** A tool's result, or its error. */
export function result(props: Props): HTMLElement {
  const node = el('div', 'tool-result');
  if (props.error) node.append(el('span', 'tool-error', `failed: ${text((props.error as Props).message)}`));
  else node.append(json(props.result ?? props.content ?? props));
  return node;
}

/** A timeline entry for an event or an action. */
export function timeline(message: OutputMessage): HTMLElement {
  const props = (message.props ?? {}) as Props;
  const node = el('li', `timeline-item ${message.type}`);
  const name = message.type === 'event' ? text(props.event) : text(props.name);
  node.append(el('span', 'timeline-kind', message.type ?? ''), el('span', 'timeline-name', ` ${name}`));
  const data = message.type === 'event' ? props.data : props.payload;
  if (data !== undefined) node.append(json(data));
  return node;
}
