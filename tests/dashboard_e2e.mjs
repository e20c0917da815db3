// Drives headless Chromium (Debian's) with playwright-core against a running coordinator:
// opens the dashboard, submits the job (so its telemetry arrives live), and asserts that
//   * the jobs table shows the job and the dashboard selects it,
//   * the loss chart gains points while the job runs (two readings, both while RUNNING),
//   * the sink-mass heatmap and the workers table are filled in,
// then saves a screenshot. Usage (from dashboard_e2e_test.sh):
//   node dashboard_e2e.mjs <web dir with node_modules> <dashboard url> <screenshot.png> -- <submit command...>
import { spawnSync } from 'node:child_process';
import { fail, launchChromium } from './browser.mjs';

const [webDir, url, screenshot, dashdash, ...submit] = process.argv.slice(2);
if (dashdash !== '--' || submit.length === 0) {
  console.error('usage: dashboard_e2e.mjs <web dir> <url> <screenshot> -- <submit command>');
  process.exit(2);
}
const errors = [];
const browser = await launchChromium(webDir);
try {
  const page = await browser.newPage({ viewport: { width: 1360, height: 1100 } });
  const requests = [];
  page.on('request', (request) => requests.push(request.url()));

  page.on('pageerror', (error) => errors.push(String(error)));
  page.on('console', (message) => {
    if (message.type() === 'error') console.error(`page console: ${message.text()}`);
    // The server's Content-Security-Policy must allow everything the page loads.
    if (/Content Security Policy/i.test(message.text())) errors.push(message.text());
  });
  await page.goto(url, { waitUntil: 'load', timeout: 20000 });
  await page.waitForSelector('#workers tbody tr[data-host]', { timeout: 20000 });

  const submitted = spawnSync(submit[0], submit.slice(1), { encoding: 'utf8', timeout: 60000 });
  if (submitted.status !== 0) throw new Error(`submit failed: ${submitted.stderr}${submitted.stdout}`);
  const job = submitted.stdout.trim();
  console.log(`submitted ${job}`);

  const row = `#jobs tbody tr[data-job="${job}"]`;
  await page.waitForSelector(row, { timeout: 20000 });
  const chart = '.chart[data-series="loss"]';
  await page.waitForSelector(chart, { timeout: 20000 });
  const points = () => page.$eval(chart, (node) => Number(node.dataset.points));
  // The coordinator's view of the job (the table's badge is polled, so it may lag).
  const state = () => page.evaluate(async (id) => (await (await fetch(`api/job?id=${id}`)).json()).state, job);

  // Two readings while the job is running: the second must have more points than the first.
  await page.waitForFunction((selector) => Number(document.querySelector(selector).dataset.points) >= 1,
    chart, { timeout: 120000 });
  const first = await points();
  const firstState = await state();
  const deadline = Date.now() + 120000;
  let second = first;
  while (Date.now() < deadline && second <= first) {
    await page.waitForTimeout(250);
    second = await points();
  }
  const secondState = await state();
  console.log(`loss chart: ${first} -> ${second} points (job ${firstState} -> ${secondState})`);
  if (second <= first) fail(`the loss chart did not gain points (${first} -> ${second})`);
  if (firstState !== 'JOB_STATE_RUNNING') fail(`the job was ${firstState}, not running, at the first reading`);

  await page.waitForFunction(() => Number(document.querySelector('.chart[data-series="sink_mass"]')?.dataset.points) >= 1,
    null, { timeout: 30000 });
  const selected = await page.$eval('#job-title', (node) => node.textContent);
  if (!selected.includes(job)) fail(`the dashboard shows "${selected}", not ${job}`);
  const workers = await page.$$eval('#workers tbody tr[data-host] .badge', (nodes) => nodes.map((n) => n.textContent));
  if (!workers.length || workers.some((s) => s !== 'alive')) fail(`workers table: ${workers}`);

  await page.waitForTimeout(600);  // let the last frame draw
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(`screenshot: ${screenshot}`);

  const origin = new URL(url).origin;
  const external = requests.filter((r) => !r.startsWith(origin) && !r.startsWith('data:'));
  if (external.length) fail(`the page loaded from the network: ${external.join(', ')}`);
  if (errors.length) fail(`page errors: ${errors.join('; ')}`);
} catch (error) {
  fail(`${error.message}; page errors: ${errors.join('; ') || 'none'}`);
  const page = browser.contexts()[0]?.pages()[0];
  if (page) await page.screenshot({ path: screenshot.replace(/\.png$/, '-failure.png'), fullPage: true });
} finally {
  await browser.close();
}
