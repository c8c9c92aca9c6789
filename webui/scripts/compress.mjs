// Pre-compressed copies of the built console (file.br, file.gz beside each file), which
// the key server sends to browsers that accept them: the server spends no CPU
// compressing per request, and brotli at its highest level is affordable once per build.
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { brotliCompressSync, constants, gzipSync } from "node:zlib";

const COMPRESSIBLE = /\.(js|css|html|svg|json|txt|map)$/;
const MIN_BYTES = 1024; // smaller files gain nothing worth a second request path

function* files(dir) {
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) yield* files(path);
    else if (COMPRESSIBLE.test(name)) yield path;
  }
}

let before = 0;
let after = 0;
for (const path of files(process.argv[2] ?? "dist")) {
  const data = readFileSync(path);
  if (data.length < MIN_BYTES) continue;
  const br = brotliCompressSync(data, {
    params: { [constants.BROTLI_PARAM_QUALITY]: 11, [constants.BROTLI_PARAM_SIZE_HINT]: data.length },
  });
  writeFileSync(`${path}.br`, br);
  writeFileSync(`${path}.gz`, gzipSync(data, { level: 9 }));
  before += data.length;
  after += br.length;
}
console.log(`compressed ${(before / 1024).toFixed(0)} KiB of console assets to ${(after / 1024).toFixed(0)} KiB (brotli)`);
