// The dashboard's workers table a page at a time (dashboard_workers_test.sh registers host-0..4,
// slices 0,0,0,1,1, and opens the page with #workers_page=2). Asserts that
//   * the slice summary counts every host by slice, and all of them, on every page,
//   * next, next, prev walk the pages, each listing its hosts in order, with the range shown,
//   * device memory is asked only for the hosts of pages shown.
// Usage: node dashboard_workers.mjs <web dir with node_modules> <dashboard url>
import { fail, launchChromium } from './browser.mjs';

const [webDir, url] = process.argv.slice(2);
const browser = await launchChromium(webDir);
const errors = [];
try {
  const page = await browser.newPage();
  const asked = [];  // hosts whose device memory the page asked for
  page.on('request', (request) => {
    const host = new URL(request.url()).searchParams.get('host');
    if (request.url().includes('/api/memory')) asked.push(host);
  });
  page.on('pageerror', (error) => errors.push(String(error)));
  await page.goto(url, { waitUntil: 'load', timeout: 20000 });

  const listed = () => page.$$eval('#workers tbody tr[data-host]', (rows) => rows.map((r) => r.dataset.host).join(' '));
  const range = () => page.$eval('#workers-range', (node) => node.textContent);
  const expectPage = async (hosts, text) => {
    await page.waitForFunction((want) => [...document.querySelectorAll('#workers tbody tr[data-host]')]
      .map((r) => r.dataset.host).join(' ') === want, hosts, { timeout: 20000 })
      .catch(async () => fail(`the table lists "${await listed()}", not "${hosts}"`));
    if ((await range()) !== text) fail(`the pager reads "${await range()}", not "${text}"`);
  };

  await expectPage('host-0 host-1', '1–2 of 5');
  const seenFirst = new Set(asked);
  for (const host of seenFirst) {
    if (host !== 'host-0' && host !== 'host-1') fail(`memory asked for ${host} while page 1 was shown`);
  }
  const slices = await page.$$eval('#worker-slices tbody tr', (rows) => rows.map((r) =>
    `${r.dataset.slice}:${[...r.cells].slice(1).map((c) => c.textContent).join(',')}`).join(' '));
  if (slices !== '0:3,0,0,0 1:2,0,0,0 all:5,0,0,0') fail(`the slice summary reads "${slices}"`);
  if (!(await page.$eval('#workers-prev', (b) => b.disabled))) fail('prev is enabled on the first page');

  await page.click('#workers-next');
  await expectPage('host-2 host-3', '3–4 of 5');
  await page.click('#workers-next');
  await expectPage('host-4', '5–5 of 5');
  if (!(await page.$eval('#workers-next', (b) => b.disabled))) fail('next is enabled on the last page');
  await page.click('#workers-prev');
  await expectPage('host-2 host-3', '3–4 of 5');
  console.log(`pages walked; memory asked for: ${[...new Set(asked)].join(' ')}`);
  if (errors.length) fail(`page errors: ${errors.join('; ')}`);
} catch (error) {
  fail(`${error.message}; page errors: ${errors.join('; ') || 'none'}`);
} finally {
  await browser.close();
}
