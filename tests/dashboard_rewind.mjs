// The dashboard through an automatic recovery (driven by recovery_test.sh): headless Chromium
// watches a running job live while one of its hosts is killed and the job restarts from a
// checkpoint, twice. When the job has ended it asserts that
//   * the job header lists each restart (run 2 from step 60, run 3 from step 30),
//   * the loss chart holds exactly one point per step, 1..<steps> (the lost runs' steps were
//     dropped at each rewind and drawn again from the re-run),
//   * the goodput line shows the coordinator's ratio and the re-run steps' badput.
// Usage: node dashboard_rewind.mjs <web dir> <dashboard url> <job> <steps> <screenshot.png>
import { fail, launchChromium } from './browser.mjs';

const [webDir, url, job, stepsText, screenshot] = process.argv.slice(2);
const steps = Number(stepsText);
const browser = await launchChromium(webDir);
const errors = [];
try {
  const page = await browser.newPage({ viewport: { width: 1360, height: 1000 } });
  page.on('pageerror', (error) => errors.push(String(error)));
  await page.goto(`${url}#job=${encodeURIComponent(job)}`, { waitUntil: 'load', timeout: 20000 });
  const chart = '.chart[data-series="loss"]';
  await page.waitForSelector(chart, { timeout: 30000 });
  const state = () => page.evaluate(async (id) => (await (await fetch(`api/job?id=${id}`)).json()).state, job);
  const ended = ['JOB_STATE_SUCCEEDED', 'JOB_STATE_FAILED', 'JOB_STATE_CANCELLED'];
  const deadline = Date.now() + 240000;
  while (Date.now() < deadline && !ended.includes(await state())) await page.waitForTimeout(500);
  await page.waitForFunction(([selector, n]) =>
    Number(document.querySelector(selector)?.dataset.points) >= n, [chart, steps], { timeout: 30000 })
    .catch(() => {});
  await page.waitForTimeout(2500);  // the jobs poll (2 s) brings the final manifest's goodput
  const runs = await page.$$eval('#job-runs li', (nodes) => nodes.map((n) => n.textContent));
  const { points, lastStep } = await page.$eval(chart, (node) =>
    ({ points: Number(node.dataset.points), lastStep: Number(node.dataset.lastStep) }));
  const goodput = await page.$eval('#job-goodput', (node) => ({
    ratio: Number(node.dataset.ratio),
    text: node.textContent,
    causes: [...node.querySelectorAll('.badput')].map((n) => n.dataset.cause),
  }));
  await page.screenshot({ path: screenshot, fullPage: true });
  console.log(`dashboard: runs ${JSON.stringify(runs)}; loss chart ${points} points, last step ${lastStep}; ${goodput.text}`);
  if (!runs.some((r) => r.startsWith('run 2: restarted from the checkpoint of step 60 ')) ||
      !runs.some((r) => r.startsWith('run 3: restarted from the checkpoint of step 30 '))) {
    fail(`the job header does not list both restarts: ${JSON.stringify(runs)}`);
  }
  if (points !== steps || lastStep !== steps) {
    fail(`the loss chart holds ${points} points up to step ${lastStep}, not one per step 1..${steps}`);
  }
  if (!(goodput.ratio > 0 && goodput.ratio < 1) || !goodput.causes.includes('rerun_steps')) {
    fail(`goodput line: ${JSON.stringify(goodput)}`);
  }
  if (errors.length) fail(`page errors: ${errors.join('; ')}`);
} catch (error) {
  fail(`${error.message}; page errors: ${errors.join('; ') || 'none'}`);
} finally {
  await browser.close();
}
