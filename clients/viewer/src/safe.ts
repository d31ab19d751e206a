// What agent output may turn into on the page: nothing that runs. Markdown becomes HTML that DOMPurify makes
// inert (no script, no event handler, no style, links only to http(s) and mailto, opened apart); media and
// file URLs are followed only when they are http(s) (or, for media, a data: URL of that media's kind).
// Everything else goes in as text.

import DOMPurify from 'dompurify';
import { marked } from 'marked';

const purify = DOMPurify(window);
purify.addHook('afterSanitizeAttributes', (node) => {
  if (node.tagName === 'A') {
    node.setAttribute('target', '_blank');
    node.setAttribute('rel', 'noopener noreferrer nofollow');
  }
});

const LINKS = /^(?:https?:|mailto:)/i;

/** Markdown as inert HTML. */
export function markdown(text: string): DocumentFragment {
  // A line break in agent output is one on the page (as chat interfaces show it), not Markdown's soft break.
  const html = marked.parse(text, { async: false, gfm: true, breaks: true }) as string;
  return purify.sanitize(html, {
    RETURN_DOM_FRAGMENT: true,
    ALLOWED_URI_REGEXP: LINKS,
    FORBID_TAGS: ['style', 'form', 'input', 'button', 'iframe', 'object', 'embed', 'svg', 'math'],
    FORBID_ATTR: ['style'],
  });
}

/** `url` when it may be loaded as `kind` (`image`, `audio`, `video`) or followed (`link`); otherwise null. */
export function safeUrl(url: unknown, kind: 'image' | 'audio' | 'video' | 'link'): string | null {
  if (typeof url !== 'string') return null;
  let parsed: URL;
  try {
    parsed = new URL(url, window.location.href);
  } catch {
    return null;
  }
  if (parsed.protocol === 'http:' || parsed.protocol === 'https:') return parsed.href;
  if (kind !== 'link' && parsed.protocol === 'data:' && url.slice(5).toLowerCase().startsWith(`${kind}/`)) return url;
  return null;
}

/** An element with text content (never HTML) and a class. */
export function el<K extends keyof HTMLElementTagNameMap>(tag: K, className?: string, text?: string): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

/** Any value as indented JSON text. */
export function json(value: unknown): HTMLPreElement {
  return el('pre', 'json', JSON.stringify(value, null, 2));
}
