// The session viewer in a real browser: Debian's chromium driven by
// playwright-core, against a real oceancode-proxy in front of the fake
// upstream, with a session recorded through it (a 20k line, so it cuts).
// Run by viewer-tests/run.sh; screenshots go to $WORK/screenshots.
//
// Asserts: the sessions list shows the session; the chart has one point per
// step and one marker per cut; the toggle hides the cut rows and shows the
// stub; search finds a word and links to its row; a message holding
// <script> and <img onerror> renders as text (no dialog, no element, no
// script ran); a new step appears without a reload.
import { spawn, execFileSync } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const BIN = resolve(process.env.OCEANCODE_BIN_DIR || "target/debug");
const WORK = resolve(process.env.VIEWER_WORK || "viewer-tests/.work");
const SHOTS = join(WORK, "screenshots");
const STEPS = 30;
const XSS = "Fix the tests <script>alert('xss')</script><img src=x onerror=\"alert(1)\"> and report";

const procs = [];
let failures = 0;
let passed = 0;

function check(cond, what) {
  if (cond) {
    passed++;
    console.log(`ok   ${what}`);
  } else {
    failures++;
    console.log(`FAIL ${what}`);
  }
}

/** Start `cmd` and resolve with the first match of `re` on `stream`. */
function start(name, cmd, args, re, stream, env = {}) {
  return new Promise((ok, fail) => {
    const p = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, RUST_LOG: "warn", ...env } });
    procs.push(p);
    const log = [];
    const timer = setTimeout(() => fail(new Error(`${name} did not start: ${log.join("")}`)), 20000);
    const src = stream === "stdout" ? p.stdout : p.stderr;
    src.on("data", (d) => {
      log.push(String(d));
      const m = log.join("").match(re);
      if (m) {
        clearTimeout(timer);
        ok(m[1]);
      }
    });
    (stream === "stdout" ? p.stderr : p.stdout).on("data", (d) => log.push(String(d)));
    p.on("exit", (code) => fail(new Error(`${name} exited ${code}: ${log.join("")}`)));
  });
}

function toolOutput(step) {
  const lines = [];
  for (let i = 0; i < 120; i++) {
    lines.push(`test module_${step}_${i} ... ok (checked ${step * 1000 + i} assertions on the tideline fixture)`);
  }
  if (step === 3) lines.push("note: the flaky one is zephyrword_case in tests/tideline.rs");
  return lines.join("\n");
}

async function main() {
  rmSync(WORK, { recursive: true, force: true });
  mkdirSync(SHOTS, { recursive: true });
  const script = join(WORK, "script.json");
  writeFileSync(
    script,
    JSON.stringify({ default: { text: "Running the tests again.", tool_calls: [{ name: "Bash", input: { command: "cargo test" } }] } }),
  );
  const fake = await start("fakeup", join(BIN, "oceancode-fakeup"), ["--listen", "127.0.0.1:0", "--script", script], /listening on (http:\/\/\S+)/, "stdout");
  const data = join(WORK, "data");
  const proxy = await start(
    "proxy",
    join(BIN, "oceancode-proxy"),
    ["--data-dir", data, "serve", "--listen", "127.0.0.1:0", "--anthropic-upstream", fake, "--openai-upstream", fake, "--tideline", "20k"],
    /oceancode-proxy listening on (http:\/\/\S+)/,
    "stderr",
  );

  // A session through the proxy: tool steps with large results.
  const history = [{ role: "user", content: XSS }];
  async function step(i) {
    const r = await fetch(`${proxy}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-oceancode-session": "browser-test", "anthropic-version": "2023-06-01" },
      body: JSON.stringify({
        model: "claude-sonnet-4-5",
        max_tokens: 1024,
        tools: [{ name: "Bash", description: "Run a shell command", input_schema: { type: "object" } }],
        messages: history,
      }),
    });
    if (r.status !== 200) throw new Error(`step ${i}: ${r.status} ${await r.text()}`);
    const v = await r.json();
    history.push({ role: "assistant", content: v.content });
    const call = v.content.find((b) => b.type === "tool_use");
    history.push({ role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: toolOutput(i) }] });
  }
  for (let i = 0; i < STEPS; i++) await step(i);
  const token = readFileSync(join(data, "admin-token"), "utf8").trim();
  const auth = { authorization: `Bearer ${token}` };
  await fetch(`${proxy}/_oceancode/settle`, { method: "POST", headers: { ...auth, "content-type": "application/json" }, body: "{}" });
  const sessions = await (await fetch(`${proxy}/_oceancode/sessions`, { headers: auth })).json();
  const id = sessions.sessions[0].id;

  // The URL as `oceancode-proxy ui` prints it.
  const url = execFileSync(join(BIN, "oceancode-proxy"), ["--data-dir", data, "ui"], { encoding: "utf8" }).trim();
  check(url.startsWith(`${proxy}/_oceancode/ui/?token=`), `ui prints the viewer's URL with the token (${url.replace(token, "<token>")})`);

  const userDir = join(WORK, "chromium-profile");
  mkdirSync(userDir, { recursive: true });
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await ctx.newPage();
  const dialogs = [];
  page.on("dialog", (d) => {
    dialogs.push(d.message());
    d.dismiss().catch(() => {});
  });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  page.on("response", (r) => {
    if (r.status() >= 400) pageErrors.push(`${r.status()} ${r.url()}`);
  });
  page.on("console", (m) => {
    // Chromium asks the site root for /favicon.ico on its own (the proxy
    // answers it 404 itself); the viewer's pages name their icon.
    if (m.location().url.endsWith("/favicon.ico")) return;
    if (m.type() === "error") pageErrors.push(`${m.text()} at ${JSON.stringify(m.location())}`);
  });

  // Sessions page (the token is handed over, then dropped from the URL).
  await page.goto(url);
  check(!page.url().includes("token="), "the token leaves the address bar");
  const cookies = await ctx.cookies();
  const c = cookies.find((k) => k.name === "oceancode_ui");
  check(c && c.path === "/_oceancode/ui/" && c.httpOnly && c.sameSite === "Strict", "the token is kept in an HttpOnly SameSite=Strict cookie scoped to the viewer");
  const row = page.locator(`#sessions tr[data-session="${id}"]`);
  check((await row.count()) === 1, "the sessions list shows the session");
  await page.screenshot({ path: join(SHOTS, "sessions.png") });

  // Session page: chart, cuts, full view.
  await row.locator("a").first().click();
  await page.waitForSelector("#chart");
  const points = await page.locator("#chart circle.pt").count();
  check(points === STEPS, `the chart has one point per step (${points} of ${STEPS})`);
  const live = await page.evaluate(async (u) => (await fetch(u)).json(), `/_oceancode/ui/s/${encodeURIComponent(id)}/live`);
  const markers = await page.locator("#chart line.cut").count();
  const cutRows = await page.locator("#cuts tbody tr").count();
  check(live.cuts > 0 && markers === live.cuts && cutRows === live.cuts, `one marker per cut (${markers} markers, ${live.cuts} cuts)`);
  const out = await page.locator("#rows li.row.out").count();
  check(out > 0, `the full view dims the rows that left the window (${out})`);
  // Hover shows the step.
  const box = await page.locator("#chart svg").boundingBox();
  await page.mouse.move(box.x + box.width * 0.5, box.y + box.height * 0.3);
  const tip = await page.locator("#tip").textContent();
  check(/^step \d+: window/.test(tip || ""), `hovering the chart shows the step (${tip})`);
  await page.screenshot({ path: join(SHOTS, "session.png") });
  await page.locator("#conversation").screenshot({ path: join(SHOTS, "full-view.png") });
  await page.screenshot({ path: join(SHOTS, "session-full.png"), fullPage: true });

  // The hostile message renders as text.
  const first = await page.locator("#r-1 .text").first().innerText();
  check(first.includes("<script>alert('xss')</script><img src=x onerror=\"alert(1)\">"), "the <script>/<img onerror> message shows as text");
  check((await page.locator("#rows img, #rows script").count()) === 0, "no element was made from the message");

  // Toggle: the model view hides the cut rows and shows the stub.
  await page.locator('#toggle a[data-view="model"]').click();
  await page.waitForSelector("#stub");
  const stubText = await page.locator("#stub .text").innerText();
  check(stubText.startsWith("[Earlier content of this session is past the tideline"), "the model view shows the stub");
  check((await page.locator("#rows li.row.out").count()) === 0, "the model view shows no cut row");
  check((await page.locator("#r-2").count()) === 0, "the first answer, cut, is not in the model view");
  const modelRows = await page.locator("#rows li.row").count();
  // The stub's state block is shown whole, not clipped to a scroll box.
  const state = page.locator("#stub details.state pre");
  check((await state.count()) === 1, "the stub carries its state block");
  const [shown, whole, cap] = await state.evaluate((e) => [e.clientHeight, e.scrollHeight, getComputedStyle(e).maxHeight]);
  check(whole <= shown + 1 && cap === "none", `the state block is not clipped (${shown} of ${whole} px shown, max-height ${cap})`);
  await page.locator("#conversation").screenshot({ path: join(SHOTS, "model-view.png") });
  // A cut marker links to the stub.
  const hrefs = await page.locator("#chart a.cut-link").evaluateAll((as) => as.map((a) => a.getAttribute("href")));
  check(hrefs.length > 0 && hrefs.every((h) => /\?view=model&step=\d+#stub$/.test(h)), "every cut's marker links to the stub of the step that cut");
  // A marker opens the model view of its step, at the stub.
  await page.locator("#chart a.cut-link").first().click();
  await page.waitForSelector("#stub");
  const stepNav = await page.locator("#stepnav strong").innerText();
  check(/^step \d+ of \d+$/.test(stepNav) && page.url().includes("step="), `a marker opens its step's model view (${stepNav})`);
  await page.locator("#conversation").screenshot({ path: join(SHOTS, "model-view-at-cut.png") });

  // Search finds a word and links to its row.
  await page.fill("header input[name=q]", "zephyrword_case");
  await page.press("header input[name=q]", "Enter");
  await page.waitForSelector("#hits");
  const hits = await page.locator("#hits a.hit").count();
  check(hits >= 1, `search finds the word (${hits} hits)`);
  await page.screenshot({ path: join(SHOTS, "search.png") });
  await page.locator("#hits a.hit").first().click();
  await page.waitForSelector("li.row:target");
  const target = await page.locator("li.row:target").innerText();
  await page.screenshot({ path: join(SHOTS, "search-target.png") });
  check(target.includes("zephyrword_case"), "the hit opens the session at its row");

  // Live: a new step appears without a reload.
  await page.goto(`${proxy}/_oceancode/ui/s/${encodeURIComponent(id)}`);
  await page.waitForSelector("#chart");
  await page.evaluate(() => {
    window.__sameDocument = true;
  });
  await step(STEPS);
  let after = 0;
  for (let i = 0; i < 40 && after !== STEPS + 1; i++) {
    await page.waitForTimeout(250);
    after = await page.locator("#chart circle.pt").count();
  }
  const same = await page.evaluate(() => window.__sameDocument === true);
  check(after === STEPS + 1 && same, `a new step shows without a reload (${after} points, same document: ${same})`);

  // Search marks the matched words.
  await page.goto(`${proxy}/_oceancode/ui/search?q=zephyrword_case`);
  const marks = await page.locator("#hits mark").allInnerTexts();
  check(marks.length >= 1 && marks.every((m) => m.toLowerCase() === "zephyrword_case"), `search marks the matched words (${marks.join(", ")})`);

  // A long session: 1,000 steps and many cuts, on a second proxy whose
  // blocks close every 2k tokens (a cut about every 20 steps past the line).
  const LONG = 1000;
  const data2 = join(WORK, "data-long");
  const proxy2 = await start(
    "proxy (long)",
    join(BIN, "oceancode-proxy"),
    ["--data-dir", data2, "serve", "--listen", "127.0.0.1:0", "--anthropic-upstream", fake, "--openai-upstream", fake, "--tideline", "20k"],
    /oceancode-proxy listening on (http:\/\/\S+)/,
    "stderr",
    { OCEANCODE_TIDELINE_BLOCK: "2k" },
  );
  const token2 = readFileSync(join(data2, "admin-token"), "utf8").trim();
  const auth2 = { authorization: `Bearer ${token2}` };
  const longHistory = [{ role: "user", content: "A long run: keep the test suite green." }];
  async function longStep(i) {
    const r = await fetch(`${proxy2}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-oceancode-session": "long-session", "anthropic-version": "2023-06-01" },
      body: JSON.stringify({ model: "claude-sonnet-4-5", max_tokens: 1024, tools: [{ name: "Bash", description: "Run a shell command", input_schema: { type: "object" } }], messages: longHistory }),
    });
    if (r.status !== 200) throw new Error(`long step ${i}: ${r.status} ${await r.text()}`);
    const v = await r.json();
    longHistory.push({ role: "assistant", content: v.content });
    const call = v.content.find((b) => b.type === "tool_use");
    const out = [];
    for (let k = 0; k < 4; k++) out.push(`step ${i} check ${k}: ok`);
    longHistory.push({ role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: out.join("\n") }] });
  }
  const t0 = Date.now();
  for (let i = 0; i < LONG; i++) await longStep(i);
  console.log(`long session: ${LONG} steps in ${Date.now() - t0} ms`);
  await fetch(`${proxy2}/_oceancode/settle`, { method: "POST", headers: { ...auth2, "content-type": "application/json" }, body: "{}" });
  const all = await (await fetch(`${proxy2}/_oceancode/sessions`, { headers: auth2 })).json();
  const longId = all.sessions[0].id;
  const longUrl = `${proxy2}/_oceancode/ui/s/${encodeURIComponent(longId)}`;
  await page.goto(`${proxy2}/_oceancode/ui/?token=${token2}`);
  const tl = Date.now();
  await page.goto(longUrl);
  await page.waitForSelector("#chart");
  const loadMs = Date.now() - tl;
  const longLive = await page.evaluate(async (u) => (await fetch(u)).json(), `/_oceancode/ui/s/${encodeURIComponent(longId)}/live`);
  const chartSteps = Number(await page.locator("#chart").getAttribute("data-steps"));
  const longMarkers = await page.locator("#chart line.cut").count();
  check(chartSteps === LONG && longLive.steps === LONG, `the long session's chart has its ${LONG} steps (${chartSteps}; page loaded in ${loadMs} ms)`);
  check(longLive.cuts >= 15 && longMarkers === longLive.cuts, `one marker per cut on the long session (${longMarkers} markers, ${longLive.cuts} cuts)`);
  const lbox = await page.locator("#chart svg").boundingBox();
  await page.mouse.move(lbox.x + lbox.width * 0.7, lbox.y + lbox.height * 0.3);
  const ltip = await page.locator("#tip").textContent();
  check(/^step \d+: window/.test(ltip || ""), `hovering the long chart shows the step (${ltip})`);
  const heights = await page.evaluate(() => ["summary", "chart", "conversation", "cuts", "page", "exports"].map((i) => `${i} ${Math.round(document.getElementById(i)?.getBoundingClientRect().height || 0)}`).join(", "));
  console.log(`long session page heights (px): ${heights}`);
  await page.screenshot({ path: join(SHOTS, "long-session.png") });
  await page.screenshot({ path: join(SHOTS, "long-session-full.png"), fullPage: true });
  // A click on the chart opens that step's model view.
  await page.mouse.click(lbox.x + lbox.width * 0.5, lbox.y + lbox.height * 0.3);
  await page.waitForURL(/view=model&step=\d+/);
  await page.waitForSelector("#stepnav");
  const clicked = await page.locator("#stepnav strong").innerText();
  check(/^step \d+ of 1000$/.test(clicked), `a click on the chart opens that step's model view (${clicked})`);
  await page.screenshot({ path: join(SHOTS, "long-model-view.png"), fullPage: false });
  const pager = await page.locator("nav.pager").count();
  console.log(`long session model view: ${await page.locator("#rows li.row").count()} messages shown, pager: ${pager > 0}`);

  // A narrow window (a phone): nothing wider than the screen.
  const narrow = await browser.newContext({ viewport: { width: 390, height: 844 } });
  // Cookies ignore ports: the two proxies on 127.0.0.1 share the viewer's
  // cookie, so each page is opened with its proxy's token handed over.
  const np = await narrow.newPage();
  np.on("pageerror", (e) => pageErrors.push(String(e)));
  for (const [name, u, tok] of [
    ["narrow-sessions", `${proxy}/_oceancode/ui/?x=1`, token],
    ["narrow-session", `${proxy}/_oceancode/ui/s/${encodeURIComponent(id)}?view=full`, token],
    ["narrow-model-view", `${proxy}/_oceancode/ui/s/${encodeURIComponent(id)}?view=model`, token],
    ["narrow-long-session", `${longUrl}?view=full`, token2],
  ]) {
    const resp = await np.goto(`${u}&token=${tok}`);
    check(resp.status() === 200 && !np.url().includes("token="), `${name}: the page opens (${resp.status()})`);
    const wide = await np.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    check(wide <= 0, `${name}: nothing wider than a 390 px window (${wide} px over)`);
    await np.screenshot({ path: join(SHOTS, `${name}.png`) });
    if (name === "narrow-model-view") {
      await np.locator("#stub").scrollIntoViewIfNeeded();
      await np.screenshot({ path: join(SHOTS, "narrow-model-view-stub.png") });
    }
  }
  await narrow.close();

  check(dialogs.length === 0, `no dialog opened (${dialogs.join("; ")})`);
  check(pageErrors.length === 0, `no script error or policy violation (${pageErrors.join("; ")})`);
  console.log(`model view rows: ${modelRows}`);
  await browser.close();
}

try {
  await main();
} catch (e) {
  failures++;
  console.log(`FAIL ${e.stack || e}`);
} finally {
  for (const p of procs) p.kill("SIGTERM");
}
console.log(`${passed} passed, ${failures} failed; screenshots in ${SHOTS}`);
process.exit(failures ? 1 : 0);
