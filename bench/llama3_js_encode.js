// Runs npm's llama3-tokenizer-js (a JavaScript port of Llama 3's tokenizer) for the
// cross-check test (tests/common/data/llama3_js_crosscheck_test.cc) and `pipetrain-bench tokenize
// --tokenizer llama3`.
//
//   node llama3_js_encode.js PACKAGE_DIR ids FILE...   one line per file: its ids as JSON
//   node llama3_js_encode.js PACKAGE_DIR bench FILE    one JSON object: seconds, tokens,
//                                                      bytes, fnv1a (of the ids), node
//
// Both encode each file's text in one call, without <|begin_of_text|> and
// <|end_of_text|> (bos, eos: false), and with special tokens' text read as ordinary
// text, as ours reads it: the package's specialTokenRegex option, given a pattern that
// matches nothing. bench times the encoding only (not loading the package nor reading
// the file).
'use strict';
const fs = require('fs');
const path = require('path');

const [pkg, mode, ...files] = process.argv.slice(2);
if (!pkg || (mode !== 'ids' && mode !== 'bench') || files.length === 0) {
  process.stderr.write('usage: node llama3_js_encode.js PACKAGE_DIR ids|bench FILE...\n');
  process.exit(2);
}
// The package is an ES module; its CommonJS bundle holds the same code and data.
const { llama3Tokenizer } = require(
    path.join(pkg, 'bundle', 'commonjs-llama3-tokenizer-with-baked-data.cjs'));
const options = { bos: false, eos: false, specialTokenRegex: /(?!)/g };
const encode = (text) => llama3Tokenizer.encode(text, options);

if (mode === 'ids') {
  for (const file of files) {
    process.stdout.write(JSON.stringify(encode(fs.readFileSync(file, 'utf-8'))) + '\n');
  }
} else {
  const text = fs.readFileSync(files[0], 'utf-8');
  const start = process.hrtime.bigint();
  const ids = encode(text);
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  let fnv = 2166136261;
  for (const id of ids) fnv = Math.imul(fnv ^ id, 16777619) >>> 0;
  process.stdout.write(JSON.stringify({
    seconds, tokens: ids.length, bytes: Buffer.byteLength(text, 'utf-8'), fnv1a: fnv,
    node: process.version,
  }) + '\n');
}
