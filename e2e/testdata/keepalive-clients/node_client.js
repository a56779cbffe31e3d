// Keep-alive load with Node's http module, as an app would use it: one
// Agent per connection (keepAlive, maxSockets 1), its defaults otherwise
// (no retries).
//
// usage: node node_client.js URL CONNS PERIOD_MS DURATION_MS
//
// CONNS agents each GET URL every PERIOD_MS (staggered over one period)
// for DURATION_MS; prints one JSON line: ok, failed, by error class, the
// first errors. A request fails on an error or a status other than 200.
// Used by BenchmarkUntoldKeepAliveClients
// (e2e/keepalive_clients_bench_linux_test.go).
'use strict';
const http = require('http');

const [url, conns, period, duration] = [process.argv[2], +process.argv[3], +process.argv[4], +process.argv[5]];
const counts = { ok: 0, failed: 0, by_class: {}, errors: [] };
const record = (cls, err) => {
  if (cls === 'ok') { counts.ok++; return; }
  counts.failed++;
  counts.by_class[cls] = (counts.by_class[cls] || 0) + 1;
  if (counts.errors.length < 5) counts.errors.push(`${cls}: ${err}`);
};

const start = Date.now() + 100;
const end = start + duration;
let running = conns;
for (let i = 0; i < conns; i++) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  let next = start + (i * period) / conns;
  const tick = () => {
    if (next >= end) {
      agent.destroy();
      if (--running === 0) console.log(JSON.stringify(counts));
      return;
    }
    // A request ends once: a reset mid-response fires both the
    // response's and the request's error.
    let ended = false;
    const finish = (cls, detail) => {
      if (ended) return;
      ended = true;
      record(cls, detail);
      schedule();
    };
    const req = http.get(url, { agent, timeout: 5000 }, (res) => {
      res.resume();
      res.on('end', () => finish(res.statusCode === 200 ? 'ok' : `status ${res.statusCode}`, res.statusCode));
      res.on('error', (e) => finish(e.code || 'error', e.message));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e) => finish(e.message === 'timeout' ? 'timeout' : (e.code || 'error'), e.message));
  };
  const schedule = () => { next += period; setTimeout(tick, Math.max(0, next - Date.now())); };
  setTimeout(tick, Math.max(0, next - Date.now()));
}
