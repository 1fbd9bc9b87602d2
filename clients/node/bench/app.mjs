// One express 5 app for bench/sidebyside.mjs, limited one way (or not at all), each set up as
// its own documentation shows a new user, on ioredis:
//
//   none          no limiter
//   rate-limit-redis   express-rate-limit with rate-limit-redis's RedisStore (ioredis `call`)
//   flexible      rate-limiter-flexible's RateLimiterRedis (its Redis page's client:
//                 `enableOfflineQueue: false`) in the middleware its docs show: a Redis error
//                 goes to express's error handler (500), a rejection is a 429 with Retry-After
//   store         express-rate-limit with this package's RedisRlStore (the one-line switch)
//   redis-rl      this package's express middleware, the module's RL.WINDOW FIXED
//   redis-rl-lua  the same on the Lua library (mode "fallback")
//
// An error a limiter passes to next() is answered with its status (500 unless it has one).
// Every limit is a fixed window of `limit` requests per `windowMs` on the client's IP. The
// app answers GET / with "ok", and GET /calls (not limited) with the number of commands its
// ioredis client has sent and the CPU time (user + system, µs) its process has used. Usage: node bench/app.mjs kind redisPort limit windowMs prefix;
// it prints {"port": N} once it listens on a free loopback port.
import express from "express";
import { rateLimit as expressRateLimit } from "express-rate-limit";
import { RedisStore } from "rate-limit-redis";
import { RateLimiterRedis } from "rate-limiter-flexible";
import { Redis } from "ioredis";
import { RateLimiter, Window } from "../dist/esm/index.js";
import { rateLimit, ipKey } from "../dist/esm/http/express.js";
import { RedisRlStore } from "../dist/esm/http/store.js";

const [kind, redisPort, limitArg, windowArg, prefix] = process.argv.slice(2);
const limit = Number(limitArg);
const windowMs = Number(windowArg);

const client = new Redis({
  port: Number(redisPort),
  host: "127.0.0.1",
  ...(kind === "flexible" ? { enableOfflineQueue: false } : {}),
});
client.on("error", () => {}); // reconnects on its own; the limiters see the failed calls
let calls = 0;
const send = client.sendCommand.bind(client);
client.sendCommand = (...args) => {
  calls++;
  return send(...args);
};
await new Promise((resolve) => client.once("ready", resolve));

const app = express();
app.get("/calls", (_req, res) => {
  const cpu = process.cpuUsage();
  res.json({ calls, cpuUs: cpu.user + cpu.system });
});

switch (kind) {
  case "none":
    break;
  case "rate-limit-redis":
    app.use(
      expressRateLimit({
        windowMs,
        limit,
        standardHeaders: "draft-8",
        legacyHeaders: false,
        store: new RedisStore({ sendCommand: (command, ...args) => client.call(command, ...args), prefix }),
      }),
    );
    break;
  case "store":
    app.use(
      expressRateLimit({
        windowMs,
        limit,
        standardHeaders: "draft-8",
        legacyHeaders: false,
        store: new RedisRlStore({ sendCommand: (command, ...args) => client.call(command, ...args), prefix }),
      }),
    );
    break;
  case "flexible": {
    const limiter = new RateLimiterRedis({
      storeClient: client,
      points: limit,
      duration: windowMs / 1000,
      keyPrefix: prefix,
    });
    app.use((req, res, next) => {
      limiter.consume(req.ip).then(
        () => next(),
        (rej) => {
          if (rej instanceof Error) return next(rej);
          res.set("Retry-After", String(Math.ceil(rej.msBeforeNext / 1000) || 1));
          res.status(429).send("Too Many Requests");
        },
      );
    });
    break;
  }
  case "redis-rl":
  case "redis-rl-lua": {
    const limiter = new RateLimiter({ client, prefix, mode: kind === "redis-rl" ? "module" : "fallback" });
    await limiter.resolvedMode();
    app.use(
      rateLimit(limiter, {
        rules: [{ name: "api", limit: new Window({ limit, windowMs, algorithm: "FIXED" }), key: ipKey() }],
      }),
    );
    break;
  }
  default:
    throw new Error(`unknown kind ${kind}`);
}
app.get("/", (_req, res) => res.send("ok"));
// What a limiter passes on (a Redis error): 500, or the error's own status, without a stack
// on stderr (express's default handler prints one outside production).
app.use((err, _req, res, _next) => res.status(Number(err?.status) || 500).send("error"));

const server = app.listen(0, "127.0.0.1", () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
});
