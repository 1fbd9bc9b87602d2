// Helpers of the HTTP tests: servers on free loopback ports, and requests sent with
// node:http as written (a raw path such as /static/../api is sent as it is, which fetch would
// resolve first).
import { request as httpRequest, type Server as HttpServer, type IncomingHttpHeaders } from "node:http";
import type { AddressInfo } from "node:net";

export interface Reply {
  status: number;
  headers: IncomingHttpHeaders;
  text: string;
  body: Record<string, unknown> | undefined;
}

export function send(
  port: number,
  path: string,
  options: { method?: string; headers?: Record<string, string | string[]>; socketPath?: string } = {},
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      {
        ...(options.socketPath ? { socketPath: options.socketPath } : { host: "127.0.0.1", port }),
        path,
        method: options.method ?? "GET",
        headers: options.headers,
        agent: false,
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (c) => (text += c));
        res.on("end", () => {
          let body: Record<string, unknown> | undefined;
          try {
            body = JSON.parse(text) as Record<string, unknown>;
          } catch {
            body = undefined;
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, text, body });
        });
      },
    );
    req.setTimeout(10_000, () => req.destroy(new Error(`no answer to ${path} within 10 s`)));
    req.on("error", reject);
    req.end();
  });
}

/** Sends a request and goes away (destroys the socket) after ms, without reading an answer. */
export function sendAndAbandon(
  port: number,
  path: string,
  headers: Record<string, string>,
  ms: number,
): Promise<void> {
  return new Promise((resolve) => {
    const req = httpRequest({ host: "127.0.0.1", port, path, headers, agent: false });
    req.on("error", () => resolve());
    req.on("response", () => resolve());
    req.end();
    setTimeout(() => {
      req.destroy();
      resolve();
    }, ms);
  });
}

export function listen(server: HttpServer): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => resolve((server.address() as AddressInfo).port));
  });
}

export function close(server: HttpServer): Promise<void> {
  return new Promise((resolve) => {
    server.closeAllConnections?.();
    server.close(() => resolve());
  });
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Waits until f() is true (every 20 ms, at most ms). */
export async function until(f: () => boolean | Promise<boolean>, ms = 5000): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await f()) return true;
    if (Date.now() > deadline) return false;
    await sleep(20);
  }
}
