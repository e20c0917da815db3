// The dashboard shows a straggler (docs/liveness.md): headless Chromium (Debian's, through
// playwright-core) opens the page while the test throttles a host, and waits until
//   * the selected job's header says "straggler: <host>",
//   * the job's row in the jobs table carries a straggler badge naming the host,
//   * the host's row in the workers table is marked (and no other host's is),
// then saves a screenshot. Usage (from netns_hang_test.sh):
//   node dashboard_straggler.mjs <web dir with node_modules> <dashboard url> <job> <host> <screenshot.png>
import { fail, launchChromium } from '../browser.mjs';

const [webDir, url, job, host, screenshot] = process.argv.slice(2);
if (!screenshot) {
  console.error('usage: dashboard_straggler.mjs <web dir> <url> <job> <host> <screenshot>');
  process.exit(2);
}
const errors = [];
const browser = await launchChromium(webDir);
try {
  const page = await browser.newPage({ viewport: { width: 1360, height: 900 } });
  page.on('pageerror', (error) => errors.push(String(error)));
  await page.goto(`${url}#job=${job}`, { waitUntil: 'load', timeout: 20000 });
  const timeout = 30000;
  await page.waitForSelector(`#job-stragglers[data-stragglers="${host}"]`, { timeout });
  await page.waitForSelector(`#jobs tbody tr[data-job="${job}"] [data-stragglers="${host}"]`, { timeout });
  await page.waitForSelector(`#workers tbody tr[data-host="${host}"][data-straggler~="${job}"]`, { timeout });
  const header = await page.$eval('#job-stragglers', (node) => node.textContent);
  if (header !== `straggler: ${host}`) fail(`the job header says "${header}"`);
  const marked = await page.$$eval('#workers tbody tr[data-straggler]', (rows) => rows.map((r) => r.dataset.host));
  if (marked.join(',') !== host) fail(`workers marked as stragglers: ${marked.join(', ')}`);
  console.log(`dashboard: ${header}; workers table marks ${marked.join(', ')}`);
  await page.screenshot({ path: screenshot, fullPage: true });
  if (errors.length) fail(`page errors: ${errors.join('; ')}`);
} catch (error) {
  fail(`${error.message}; page errors: ${errors.join('; ') || 'none'}`);
  const page = browser.contexts()[0]?.pages()[0];
  if (page) await page.screenshot({ path: screenshot.replace(/\.png$/, '-failure.png'), fullPage: true });
} finally {
  await browser.close();
}
