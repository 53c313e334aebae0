// examples/agents-sdk/runner.mjs as TestGatewayAgentsSDK runs it: the same agents and Agents SDK
// runner, their OpenAI client given a fetch that writes every chat completion the SDK asked for and
// got to the JSONL file DRMAS_RUNNER_LOG ({"episode_id", "agent", "tools", "content"}: tools the names
// of the function tools the request offered), then each episode's reply ({"episode_id", "reply"}).
import fs from 'node:fs';
import { play, team } from '../../../examples/agents-sdk/runner.mjs';
import { serve } from '../../../examples/runner-http.mjs';

const log = (v) => fs.appendFileSync(process.env.DRMAS_RUNNER_LOG, JSON.stringify(v) + '\n');

async function logged(episode) {
  const seen = async (url, init) => {
    const asked = JSON.parse(init.body);
    const resp = await fetch(url, init);
    const answer = await resp.clone().json();
    const tools = (asked.tools ?? []).map((t) => t.function.name);
    for (const ch of answer.choices ?? []) {
      log({ episode_id: episode.episode_id, agent: answer.model, tools, content: ch.message.content ?? '' });
    }
    return resp;
  };
  const reply = await play(episode, team(episode, { fetch: seen }));
  log({ episode_id: episode.episode_id, reply });
  return reply;
}

serve(Number(new URL(process.env.DRMAS_RUNNER_URL).port), logged);
