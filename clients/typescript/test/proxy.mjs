// A TCP proxy in front of agentmux that drops one connection mid-stream, as a network does: everything is
// passed through both ways until the bytes coming back hold `marker` (an SSE `id:` line) for the first time;
// that connection is then closed right after the marker, in the middle of its event, and nothing is cut again.

import net from 'node:net';

export async function startCuttingProxy(target, marker) {
  const needle = Buffer.from(marker);
  let armed = true;
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(target.port, target.host);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
      socket.on('error', () => {});
    }
    client.pipe(upstream);
    let tail = Buffer.alloc(0);
    upstream.on('data', (chunk) => {
      if (armed) {
        const seen = Buffer.concat([tail, chunk]);
        const at = seen.indexOf(needle);
        if (at >= 0) {
          armed = false;
          const keep = at + needle.length - tail.length;
          client.write(chunk.subarray(0, Math.max(0, keep)), () => client.destroy());
          upstream.destroy();
          return;
        }
        tail = seen.subarray(Math.max(0, seen.length - needle.length));
      }
      if (!client.write(chunk)) {
        upstream.pause();
        client.once('drain', () => upstream.resume());
      }
    });
    upstream.on('end', () => client.end());
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    baseUrl: `http://127.0.0.1:${server.address().port}`,
    cut: () => !armed,
    stop: () =>
      new Promise((resolve) => {
        for (const socket of sockets) socket.destroy();
        server.close(resolve);
      }),
  };
}
