// tokref.mjs — the reference ids: Hugging Face's JavaScript tokenizer (@huggingface/tokenizers)
// over a model's tokenizer.json + tokenizer_config.json, for a list of cases.
// usage: node tokref.mjs NODE_MODULES MODEL_DIR CASES.json > out.json
// Each case {text, special, add_special} gives {ids, decoded}. "special": false means the text of
// special tokens is ordinary text (Baton's default for user content, Hugging Face's
// split_special_tokens); this reference has no such switch, so a second instance has its
// added-token matchers rebuilt without the special tokens (its vocabulary and post-processor
// keep them).
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const [nodeModules, modelDir, casesPath] = process.argv.slice(2);
const require = createRequire(path.join(nodeModules, "noop.js"));
const { Tokenizer } = require("@huggingface/tokenizers");

const json = JSON.parse(readFileSync(path.join(modelDir, "tokenizer.json"), "utf8"));
let config = {};
try {
  config = JSON.parse(readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
} catch {}

const withSpecials = new Tokenizer(json, config);
const withoutSpecials = new Tokenizer(json, config);
{
  const t = withoutSpecials;
  const Splitter = t.splitter_unnormalized.constructor;
  const plain = t.added_tokens.filter((a) => !a.special);
  const norm = (a) => a.normalized && t.normalizer !== null;
  t.splitter_unnormalized = new Splitter(plain.filter((a) => !norm(a)).map((a) => a.content));
  t.splitter_normalized = new Splitter(plain.filter(norm).map((a) => t.normalizer(a.content)));
  for (const a of t.added_tokens) if (a.special) t.added_tokens_map.delete(a.content);
}

const cases = JSON.parse(readFileSync(casesPath, "utf8"));
const out = cases.map((c) => {
  const tok = c.special ? withSpecials : withoutSpecials;
  const ids = tok.encode(c.text, { add_special_tokens: !!c.add_special }).ids;
  const decoded = ids.length
    ? withSpecials.decode(ids, { clean_up_tokenization_spaces: false })
    : "";
  return { ids, decoded };
});
process.stdout.write(JSON.stringify(out));
