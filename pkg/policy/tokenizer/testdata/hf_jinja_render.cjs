// Renders chat templates with Hugging Face's own JavaScript Jinja engine (@huggingface/jinja, the
// one transformers.js uses), for TestChatTemplateHFJinja.
//
// Usage: node hf_jinja_render.cjs CASES.json   (HF_JINJA: the folder scripts/hf-jinja.sh installed)
// CASES.json: {"now": "2026-02-03T14:05:06", "cases": [{"template", "messages", "tools",
//              "add_generation_prompt", "special_tokens": {"bos_token": …, "eos_token": …},
//              "kwargs": {…}}]}
// "now" (local time) pins the clock that the engine's strftime_now reads, as the goldens pin it.
// Writes a JSON list to stdout, one {"text": …} or {"error": …} per case.
//
// The variables are those transformers.js's apply_chat_template passes:
//   {messages, add_generation_prompt, tools, documents, ...special_tokens_map, ...kwargs}
"use strict";

const fs = require("fs");
const path = require("path");

const dir = process.env.HF_JINJA;
if (!dir) {
	console.error("HF_JINJA is not set");
	process.exit(2);
}
const { Template } = require(path.resolve(dir, "node_modules", "@huggingface", "jinja"));

const input = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
if (input.now) {
	const RealDate = Date;
	const now = new RealDate(input.now).getTime();
	global.Date = class extends RealDate {
		constructor(...args) {
			super(...(args.length ? args : [now]));
		}
		static now() {
			return now;
		}
	};
}
const compiled = new Map();
const out = input.cases.map((c) => {
	try {
		let template = compiled.get(c.template);
		if (!template) {
			template = new Template(c.template);
			compiled.set(c.template, template);
		}
		const text = template.render({
			messages: c.messages,
			add_generation_prompt: c.add_generation_prompt,
			tools: c.tools === undefined ? null : c.tools,
			documents: null,
			...c.special_tokens,
			...c.kwargs,
		});
		return { text };
	} catch (e) {
		return { error: String(e && e.message ? e.message : e) };
	}
});
process.stdout.write(JSON.stringify(out));
