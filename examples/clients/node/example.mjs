// redis-rl from Node.js (node-redis): a per-user limit with HTTP-style handling.
// Run: npm install && REDIS_URL=redis://127.0.0.1:6379 node example.mjs
import { createClient } from 'redis';

const client = createClient({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' });
await client.connect();

async function check(userId) {
  // burst 10, 5 per second
  const [allowed, limit, remaining, retryAfterMs, resetAfterMs] =
    await client.sendCommand(['RL.GCRA', `user:${userId}`, '10', '5', '1']);
  const headers = {
    'RateLimit-Limit': String(limit),
    'RateLimit-Remaining': String(remaining),
    'RateLimit-Reset': String(Math.ceil(resetAfterMs / 1000)),
  };
  if (allowed === 1) return { status: 200, headers };
  if (retryAfterMs >= 0) headers['Retry-After'] = String(Math.ceil(retryAfterMs / 1000));
  return { status: 429, headers };
}

const user = `node-example-${process.pid}`;
const statuses = [];
for (let i = 0; i < 11; i++) statuses.push((await check(user)).status);
const last = await check(user);
console.log(statuses, last);
await client.quit();
if (statuses.join() !== [...Array(10).fill(200), 429].join() || last.headers['Retry-After'] !== '1') {
  console.error('node example: unexpected replies');
  process.exit(1);
}
console.log('node example: ok');
