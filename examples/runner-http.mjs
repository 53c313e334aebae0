// The HTTP side of a gateway runner written in Node, which the TypeScript and Agents SDK examples
// share: drmas POSTs each episode to /run ({"episode_id", "task", "base_url", "api_key", "agents",
// "seed"}) and reads the runner's reply ({"reward": number, "agent_rewards": {...}}). A runner of your
// own copies this file beside its runner.mjs, or answers POST /run as it likes.
import http from 'node:http';
import { pathToFileURL } from 'node:url';

// serve answers POST /run with play's reply (500 with the reason when the episode could not be played).
export function serve(port, play) {
  const server = http.createServer((req, res) => {
    if (req.method !== 'POST' || req.url !== '/run') {
      res.writeHead(404).end();
      return;
    }
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', async () => {
      try {
        const out = JSON.stringify(await play(JSON.parse(body)));
        res.writeHead(200, { 'Content-Type': 'application/json' }).end(out);
      } catch (e) {
        res.writeHead(500, { 'Content-Type': 'text/plain' }).end(String(e?.stack ?? e));
      }
    });
  });
  server.listen(port, '127.0.0.1');
  return server;
}

// serveWhenRun serves play when the module at url (its import.meta.url) is the program Node runs, as
// drmas runs it (orchestra.runner.command): on the port of --port, else of DRMAS_RUNNER_URL.
export function serveWhenRun(url, play) {
  if (url !== pathToFileURL(process.argv[1]).href) {
    return;
  }
  const i = process.argv.indexOf('--port');
  serve(i > 0 ? Number(process.argv[i + 1]) : Number(new URL(process.env.DRMAS_RUNNER_URL).port), play);
}
