// Drives a running `drmas serve` with the official OpenAI Node SDK (npm `openai` 6.x, installed by
// scripts/openai-node.sh), one check per row of issue #30's table, streaming included. Run by
// cmd/drmas TestServeOpenAINodeSDK against a server started with --api-key and without
// --enable-weight-updates. Environment: DRMAS_URL (http://127.0.0.1:PORT), DRMAS_KEY, DRMAS_MODEL
// (the served name), OPENAI_NODE (the folder openai is installed in). Prints one line per check and
// exits 1 when any fails.
'use strict';
const path = require('path');
const mod = require(path.resolve(process.env.OPENAI_NODE, 'node_modules', 'openai'));
const OpenAI = mod.OpenAI || mod.default || mod;

const url = process.env.DRMAS_URL;
const key = process.env.DRMAS_KEY;
const model = process.env.DRMAS_MODEL;
const client = new OpenAI({ baseURL: url + '/v1', apiKey: key, maxRetries: 0, timeout: 60000 });
const msgs = [{ role: 'user', content: '2+3?' }];

let failed = 0;
function check(name, ok, detail) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${name}${ok ? '' : ': ' + detail}`);
  if (!ok) failed++;
}

async function status(fn) {
  try {
    await fn();
    return 200;
  } catch (e) {
    return e.status || String(e);
  }
}

async function main() {
  // stream: true, chat: chunks with delta, a final finish_reason, include_usage, the same text as
  // one reply.
  const one = await client.chat.completions.create({ model, messages: msgs, max_tokens: 24, seed: 3, temperature: 1 });
  const stream = await client.chat.completions.create({ model, messages: msgs, max_tokens: 24, seed: 3, temperature: 1,
    stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, chunks = 0, role = null;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.role) role = ch.delta.role;
      if (ch.delta.content) text += ch.delta.content;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  check('chat stream: same text as one reply', text === one.choices[0].message.content && finish === one.choices[0].finish_reason,
    JSON.stringify({ text, finish, want: one.choices[0] }));
  check('chat stream: role, several chunks, include_usage', role === 'assistant' && chunks > 2 && usage &&
    usage.completion_tokens === one.usage.completion_tokens, JSON.stringify({ role, chunks, usage }));

  // stream: true, completions (with logprobs in the chunks).
  const cone = await client.completions.create({ model, prompt: 'ab', max_tokens: 20, seed: 5, temperature: 1, logprobs: 2 });
  const cstream = await client.completions.create({ model, prompt: 'ab', max_tokens: 20, seed: 5, temperature: 1, logprobs: 2, stream: true });
  let ctext = '', cfinish = null, ctoks = [];
  for await (const c of cstream) {
    for (const ch of c.choices) {
      ctext += ch.text;
      if (ch.logprobs) ctoks.push(...ch.logprobs.tokens);
      if (ch.finish_reason) cfinish = ch.finish_reason;
    }
  }
  check('completions stream: same text and tokens as one reply', ctext === cone.choices[0].text && cfinish === cone.choices[0].finish_reason &&
    JSON.stringify(ctoks) === JSON.stringify(cone.choices[0].logprobs.tokens), JSON.stringify({ ctext, cfinish, want: cone.choices[0] }));

  // n: 3 (seeds seed, seed+1, seed+2); a list of prompts.
  const three = await client.chat.completions.create({ model, messages: msgs, max_tokens: 12, seed: 7, n: 3 });
  let same = three.choices.length === 3;
  for (let k = 0; k < 3 && same; k++) {
    const alone = await client.chat.completions.create({ model, messages: msgs, max_tokens: 12, seed: 7 + k });
    same = three.choices[k].index === k && three.choices[k].message.content === alone.choices[0].message.content;
  }
  check('n: 3 gives the completions of seeds 7, 8, 9', same, JSON.stringify(three.choices));
  const list = await client.completions.create({ model, prompt: ['ab', 'xyz'], max_tokens: 6, seed: 1, n: 2 });
  const second = await client.completions.create({ model, prompt: 'xyz', max_tokens: 6, seed: 2 });
  check('a list of prompts: n choices each, in order', list.choices.length === 4 && list.choices[3].text === second.choices[0].text,
    JSON.stringify(list.choices));

  // logprobs: 3 / chat top_logprobs: 3.
  const lp = await client.completions.create({ model, prompt: 'ab', max_tokens: 6, seed: 1, logprobs: 3 });
  const tops = lp.choices[0].logprobs.top_logprobs;
  check('completions logprobs: 3 alternatives per token', tops.length === 6 && tops.every((m) => Object.keys(m).length >= 3),
    JSON.stringify(tops));
  const clp = await client.chat.completions.create({ model, messages: msgs, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = clp.choices[0].logprobs.content;
  check('chat top_logprobs: 3 alternatives, the greedy token first', content.length > 0 && content.every((t) =>
    t.top_logprobs.length === 3 && t.top_logprobs[0].token === t.token && t.top_logprobs[0].logprob >= t.top_logprobs[2].logprob),
  JSON.stringify(content));

  // stop: removed from the text, matched across tokens.
  let stopped = false;
  for (let seed = 0; seed < 100 && !stopped; seed++) {
    const full = (await client.completions.create({ model, prompt: 'ab', max_tokens: 40, seed, temperature: 1 })).choices[0].text;
    const m = /[!-~]{2}/.exec(full.slice(1));
    if (!m) continue;
    const stop = m[0];
    const cut = full.indexOf(stop);
    const r = await client.completions.create({ model, prompt: 'ab', max_tokens: 40, seed, temperature: 1, stop: [stop] });
    const s = await client.completions.create({ model, prompt: 'ab', max_tokens: 40, seed, temperature: 1, stop: [stop], stream: true });
    let st = '';
    for await (const c of s) st += c.choices.map((ch) => ch.text).join('');
    check(`stop ${JSON.stringify(stop)}: the text ends before it, streamed too`, r.choices[0].text === full.slice(0, cut) &&
      r.choices[0].finish_reason === 'stop' && st === r.choices[0].text, JSON.stringify({ full, got: r.choices[0], st }));
    stopped = true;
  }
  check('stop: a completion to cut was found', stopped, 'no two printable characters in 100 completions');

  // /v1/completions text never ends with <|im_end|>.
  let ended = false;
  for (let seed = 0; seed < 100 && !ended; seed++) {
    const r = await client.completions.create({ model, prompt: 'ab', max_tokens: 120, seed, temperature: 1.5, return_token_ids: true });
    const ch = r.choices[0];
    if (ch.finish_reason !== 'stop') continue;
    ended = true;
    check('completions text holds no end-of-turn token', !/<\|im_end\|>|<\|endoftext\|>/.test(ch.text), JSON.stringify(ch));
  }
  check('a completion that ends with the end-of-turn token was found', ended, 'none in 100 seeds');

  // unknown model: 404 in OpenAI's error shape; GET /v1/models/{id}.
  const got = await client.models.retrieve(model);
  check('GET /v1/models/{id}', got.id === model, JSON.stringify(got));
  let err = null;
  try {
    await client.chat.completions.create({ model: 'gpt-4o', messages: msgs });
  } catch (e) {
    err = e;
  }
  check('unknown model: 404 NotFoundError with a message', err && err.status === 404 && err.error && err.error.message &&
    err.code === 'model_not_found', String(err));
  check('GET /v1/models/{unknown}: 404', (await status(() => client.models.retrieve('gpt-4o'))) === 404, 'not 404');

  // Authorization: Bearer: a wrong key is 401; /health needs none.
  const wrong = new OpenAI({ baseURL: url + '/v1', apiKey: 'wrong', maxRetries: 0 });
  let aerr = null;
  try {
    await wrong.models.list();
  } catch (e) {
    aerr = e;
  }
  check('wrong key: 401 AuthenticationError', aerr && aerr.status === 401 && aerr instanceof OpenAI.AuthenticationError, String(aerr));
  check('/health without a key: 200', (await fetch(url + '/health')).status === 200, 'not 200');

  // The weight-changing endpoints: 403 with the key on a server without --enable-weight-updates.
  for (const [p, body] of [['/update_weights_from_disk', { model_path: '/' }], ['/collective_rpc', { method: 'reload_weights' }],
    ['/update_weight_version', { new_version: 'x' }]]) {
    const r = await fetch(url + p, { method: 'POST', headers: { Authorization: 'Bearer ' + key, 'Content-Type': 'application/json' },
      body: JSON.stringify(body) });
    const j = await r.json();
    check(`${p}: 403 with weight updates off`, r.status === 403 && j.error && j.error.message, JSON.stringify(j));
  }
}

main().then(() => process.exit(failed ? 1 : 0), (e) => {
  console.log('FAIL', e && e.stack ? e.stack : e);
  process.exit(1);
});
