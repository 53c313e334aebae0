// examples/typescript/runner.mjs as TestGatewayOpenAINodeSDK runs it: the same team and the same
// OpenAI Node SDK client, given a fetch that writes every answer the SDK received to the JSONL file
// DRMAS_RUNNER_LOG ({"episode_id", "agent", "id", "content"}), then each episode's reply
// ({"episode_id", "reply"}). Before its first episode it checks the endpoint's key: one request
// without it (plain fetch) and one with a wrong key (the SDK), each logged with the status it got
// ({"check", "status"}).
import fs from 'node:fs';
import { client, play } from '../../../examples/typescript/runner.mjs';
import { serve } from '../../../examples/runner-http.mjs';

const log = (v) => fs.appendFileSync(process.env.DRMAS_RUNNER_LOG, JSON.stringify(v) + '\n');
let checked = null;

async function checkKey(episode) {
  const body = JSON.stringify({ model: 'solver', messages: [{ role: 'user', content: 'P1+1' }] });
  const keyless = await fetch(episode.base_url + '/chat/completions', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body });
  log({ check: 'keyless', status: keyless.status });
  try {
    await client({ ...episode, api_key: 'sk-wrong' }).chat.completions.create({ model: 'solver', messages: [{ role: 'user', content: 'P1+1' }] });
    log({ check: 'wrong_key', status: 200 });
  } catch (e) {
    log({ check: 'wrong_key', status: e.status ?? String(e) });
  }
}

async function logged(episode) {
  checked ??= checkKey(episode);
  await checked;
  const seen = async (url, init) => {
    const resp = await fetch(url, init);
    const answer = await resp.clone().json();
    for (const ch of answer.choices ?? []) {
      log({ episode_id: episode.episode_id, agent: answer.model, id: answer.id, content: ch.message.content });
    }
    return resp;
  };
  const reply = await play(episode, client(episode, { fetch: seen }));
  log({ episode_id: episode.episode_id, reply });
  return reply;
}

serve(Number(new URL(process.env.DRMAS_RUNNER_URL).port), logged);
