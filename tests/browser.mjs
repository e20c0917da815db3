// Headless Chromium (Debian's, or $CHROMIUM) through playwright-core from <web dir>/node_modules,
// shared by the browser tests (dashboard_e2e.mjs, netns/dashboard_straggler.mjs).
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';

export async function launchChromium(webDir) {
  const { chromium } = createRequire(join(resolve(webDir), 'package.json'))('playwright-core');
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
  });
}

// "FAIL: message" on stderr and a failing exit code, without stopping the test.
export function fail(message) {
  console.error(`FAIL: ${message}`);
  process.exitCode = 1;
}
