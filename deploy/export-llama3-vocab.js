// Writes the Llama 3 vocabulary that npm's llama3-tokenizer-js bakes into its JavaScript
// as two plain files in GPT-2's layout, which `pipetrain tokenize --tokenizer llama3`
// reads (common/data/llama3_bpe.h). Run by deploy/install-deps.sh:
//
//   node export-llama3-vocab.js PACKAGE_DIR OUT_DIR
//
// OUT_DIR/encoder.json: {"symbol": id} for all 128,256 ids in id order: the 128,000
//   byte-level symbols (bytes shown as GPT-2's printable characters) and the 256 special
//   tokens after them (<|begin_of_text|> = 128000, <|end_of_text|> = 128001, ...), as
//   the package's vocabById lists them.
// OUT_DIR/vocab.bpe: "#version: llama3-tokenizer-js VERSION", then one merge a line,
//   "left right", highest priority first, as the package's merges map ranks them.
'use strict';
const fs = require('fs');
const path = require('path');

const [pkg, out] = process.argv.slice(2);
if (!pkg || !out) {
  process.stderr.write('usage: node export-llama3-vocab.js PACKAGE_DIR OUT_DIR\n');
  process.exit(2);
}
// The package is an ES module; its CommonJS bundle holds the same code and data.
const bundle = path.join(pkg, 'bundle', 'commonjs-llama3-tokenizer-with-baked-data.cjs');
const { llama3Tokenizer: tokenizer } = require(bundle);
const { version } = JSON.parse(fs.readFileSync(path.join(pkg, 'package.json'), 'utf-8'));

const symbols = tokenizer.vocabById;
if (symbols.length !== 128256) {
  throw new Error(`${bundle}: ${symbols.length} symbols, expected 128256`);
}
if (new Set(symbols).size !== symbols.length) throw new Error(`${bundle}: a symbol twice`);
// Written by hand: a JavaScript object would put keys such as "123" first.
const encoder = `{${symbols.map((symbol, id) => `${JSON.stringify(symbol)}: ${id}`).join(',\n')}}\n`;

// merges: "left right" -> priority (lower merges first).
const merges = [...tokenizer.merges.entries()].sort((a, b) => a[1] - b[1]).map(([pair]) => pair);
for (const pair of merges) {
  if (pair.split(' ').length !== 2) throw new Error(`${bundle}: the merge '${pair}'`);
}

fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, 'encoder.json'), encoder);
fs.writeFileSync(path.join(out, 'vocab.bpe'),
                 `#version: llama3-tokenizer-js ${version}\n${merges.join('\n')}\n`);
