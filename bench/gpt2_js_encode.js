// Runs npm's gpt-3-encoder (the JavaScript port of OpenAI's GPT-2 encoder) for the
// cross-check test (tests/common/data/gpt2_js_crosscheck_test.cc) and `pipetrain-bench tokenize`.
//
//   node gpt2_js_encode.js PACKAGE_DIR ids FILE...   one line per file: its ids as JSON
//   node gpt2_js_encode.js PACKAGE_DIR bench FILE    one JSON object: seconds, tokens,
//                                                    bytes, fnv1a (of the ids), node
//
// bench times the encoding only (not loading the package nor reading the file). It
// calls encode() once per line, cut where our tokenizer cuts too (after a '\n' between
// two ASCII graphic characters), so the ids are those of one call on the whole text:
// one call on megabytes would spend its time in encode()'s own array concatenation,
// which is quadratic in the tokens of a call, not in the encoding.
'use strict';
const fs = require('fs');

const [pkg, mode, ...files] = process.argv.slice(2);
if (!pkg || (mode !== 'ids' && mode !== 'bench') || files.length === 0) {
  process.stderr.write('usage: node gpt2_js_encode.js PACKAGE_DIR ids|bench FILE...\n');
  process.exit(2);
}
const { encode } = require(pkg);

if (mode === 'ids') {
  for (const file of files) {
    process.stdout.write(JSON.stringify(encode(fs.readFileSync(file, 'utf-8'))) + '\n');
  }
} else {
  const text = fs.readFileSync(files[0], 'utf-8');
  const parts = text.split(/(?<=[!-~]\n)(?=[!-~])/);
  const start = process.hrtime.bigint();
  let tokens = 0;
  let fnv = 2166136261;
  for (const part of parts) {
    for (const id of encode(part)) {
      fnv = Math.imul(fnv ^ id, 16777619) >>> 0;
      ++tokens;
    }
  }
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  process.stdout.write(JSON.stringify({
    seconds, tokens, bytes: Buffer.byteLength(text, 'utf-8'), fnv1a: fnv,
    node: process.version,
  }) + '\n');
}
