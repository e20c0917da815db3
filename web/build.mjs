// Bundles the dashboard into static files: node build.mjs <output folder>.
// Everything the page needs (uPlot included) ends up in the folder; nothing loads from the
// network at run time.
import * as esbuild from 'esbuild';
import { copyFileSync, mkdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = resolve(process.argv[2] ?? join(here, '..', 'build', 'web'));
mkdirSync(out, { recursive: true });
await esbuild.build({
  entryPoints: { app: join(here, 'src', 'main.js') },
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['chrome110', 'firefox110', 'safari16'],
  outdir: out,
  logLevel: 'warning',
});
copyFileSync(join(here, 'src', 'index.html'), join(out, 'index.html'));
console.log(`web: dashboard built into ${out}`);
