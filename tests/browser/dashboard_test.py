#!/usr/bin/python3
"""The coordinator's dashboard in a real browser (headless Chromium through Selenium).

Starts a real cluster from the built binaries (a coordinator and three stage servers on
127.0.0.1, ports read back from their output), submits a job on two of the stages with
the CLI and checks what a person watching would: the job is listed, its step counter and
loss move while it runs, the loss curve has a point per step done (against the JSON
API), so has the learning-rate curve of its cosine schedule, the Gantt a row per stage, the stage that is not in the job turns red once killed,
an unknown job says 404, a restarted coordinator shows "reconnecting" and then recovers,
and with --token-file the page without the cookie is the login form. Screenshots go to
--artifacts. Every wait has a deadline; only the processes started here are stopped,
by their pid.

  /usr/bin/python3 tests/browser/dashboard_test.py --bin build/bin \
      --artifacts build/test-artifacts
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

ARGS = None
HEARTBEAT_TIMEOUT_S = 2


def corpus(size=60000):
    """The same English-like text as tests/testing/corpus_text.h."""
    words = ["the ", "pipeline ", "stage ", "sends ", "a ", "tensor ", "to ", "its ",
             "neighbour ", "and ", "waits ", "for ", "gradients. "]
    out, x = [], 12345
    n = 0
    while n < size:
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        w = words[(x >> 33) % 13]
        out.append(w)
        n += len(w)
    return "".join(out)


class Process:
    """A started binary whose output lines (stdout and stderr) are collected on a thread."""

    def __init__(self, argv):
        self.argv = argv
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        with self.proc.stdout:
            for line in self.proc.stdout:
                with self.cond:
                    self.lines.append(line.rstrip("\n"))
                    self.cond.notify_all()

    def wait_for_line(self, prefix, timeout=30):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    if prefix in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"{self.argv[0]}: no line '{prefix}' within {timeout} s "
                                         f"(exit {self.proc.poll()}); output:\n" +
                                         "\n".join(self.lines[-30:]))
                self.cond.wait(min(left, 0.5))

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)  # ours, by pid
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def log(self):
        with self.cond:
            return "\n".join(self.lines)


class Cluster:
    """A coordinator (state dir, gRPC and HTTP on port 0) and `stages` stage servers."""

    def __init__(self, state_dir, stages, token_file=None):
        self.state_dir = state_dir
        self.token_file = token_file
        self.auth = ["--token-file", token_file] if token_file else []
        self.coordinator = None
        self.address = "127.0.0.1:0"
        self.http = "127.0.0.1:0"
        self.stages = []
        try:
            self.start_coordinator()
            for _ in range(stages):
                p = Process([os.path.join(ARGS.bin, "pipetrain-stage"), "--listen", "127.0.0.1:0",
                             "--device", "cpu", "--coordinator", self.address] + self.auth)
                self.stages.append(p)
                p.address = p.wait_for_line("stage listening on ").rsplit(" ", 1)[1]
        except BaseException:
            self.stop()  # what did start, before the failure goes up
            raise

    def start_coordinator(self):
        # The job's corpus is written beside the state dir (write_spec), outside the
        # coordinator's default data roots (its working folder and its state dir).
        self.coordinator = Process(
            [os.path.join(ARGS.bin, "pipetrain-coordinator"), "--listen", self.address,
             "--state-dir", self.state_dir, "--http", self.http,
             "--data-root", os.path.dirname(self.state_dir),
             "--heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S)] + self.auth)
        http = self.coordinator.wait_for_line("coordinator http listening on ")
        self.http = http.rsplit(" ", 1)[1]
        line = self.coordinator.wait_for_line("coordinator listening on ")
        self.address = line.rsplit(" ", 1)[1]

    @property
    def url(self):
        return "http://" + self.http

    def cli(self, *args, timeout=120):
        r = subprocess.run([os.path.join(ARGS.bin, "pipetrain"), *args, "--address", self.address]
                           + self.auth, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise AssertionError(f"pipetrain {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
        return r.stdout

    def api(self, path):
        req = urllib.request.Request(self.url + path)
        if self.token_file:
            with open(self.token_file) as f:
                req.add_header("Authorization", "Bearer " + f.read().strip())
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stop(self):
        for s in self.stages:
            s.stop()
        if self.coordinator:
            self.coordinator.stop()


def wait_until(what, predicate, timeout):
    """Polls `predicate` until it returns something true; fails naming `what`."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # a page being redrawn, a stale element: try again
            last_error = e
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout} s" +
                         (f" (last error: {last_error})" if last_error else ""))


def browser(downloads=None):
    options = Options()
    if downloads:
        options.add_experimental_option("prefs", {"download.default_directory": downloads,
                                                  "download.prompt_for_download": False})
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1400,1200"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(30)
    return driver


def write_spec(folder, steps, stages):
    path = os.path.join(folder, "corpus.txt")
    with open(path, "w") as f:
        f.write(corpus())
    spec = {
        "name": "dashboard browser test",
        "model": {"vocab_size": 256, "seq_len": 64, "d_model": 64, "n_heads": 4, "n_layers": 4},
        "pipeline": {"stages": stages, "micro_batches": 4, "schedule": "1f1b", "chunks": 1,
                     "recompute": "never"},
        "training": {"steps": steps, "batch_size": 16, "seed": 1, "lr": 0.003,
                     "warmup_steps": min(10, steps - 1), "lr_schedule": "cosine",
                     "min_lr": 0.0003},
        "data": {"corpus": path, "validation_fraction": 0.1, "validate_every_steps": 25},
    }
    spec_path = os.path.join(folder, "job.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    return spec_path


def submit(cluster, spec_path):
    out = cluster.cli("submit", spec_path, "--no-wait")
    m = re.search(r"(job-\d+)", out)
    if not m:
        raise AssertionError(f"no job id in: {out}")
    return m.group(1)


def shot(driver, name):
    os.makedirs(ARGS.artifacts, exist_ok=True)
    path = os.path.join(ARGS.artifacts, name)
    driver.save_screenshot(path)
    print(f"screenshot: {path}", file=sys.stderr)


def polyline_points(driver, selector):
    lines = driver.find_elements(By.CSS_SELECTOR, selector)
    if not lines:
        return 0
    return len(lines[0].get_attribute("points").split())


class DashboardTest(unittest.TestCase):
    """One cluster and one job for every check, in order (the test names are numbered)."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="pipetrain-dashboard-")
        cls.cluster = Cluster(os.path.join(cls.dir, "state"), stages=3)
        try:
            cls.job = submit(cls.cluster, write_spec(cls.dir, steps=ARGS.steps, stages=2))
            cls.downloads = os.path.join(cls.dir, "downloads")
            os.makedirs(cls.downloads)
            cls.driver = browser(cls.downloads)
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.driver.quit()
        cls.cluster.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def job_json(self):
        return self.cluster.api(f"/api/jobs/{self.job}")

    def test_1_the_job_is_listed(self):
        d = self.driver
        d.get(self.cluster.url + "/")
        row = wait_until("the job's row", lambda: d.find_elements(
            By.CSS_SELECTOR, f"#jobs tr[data-job='{self.job}']"), 20)[0]
        self.assertIn("dashboard browser test", row.text)
        rows = wait_until("3 stages", lambda: len(d.find_elements(
            By.CSS_SELECTOR, "#cluster tbody tr[data-stage]")) == 3 or None, 20)
        self.assertTrue(rows)

    def test_2_step_counter_and_loss_advance(self):
        d = self.driver
        d.get(f"{self.cluster.url}/jobs/{self.job}")
        counter = lambda: int(d.find_element(By.CSS_SELECTOR, ".step-counter").text or 0)
        first = wait_until("a first step", lambda: counter() > 0 and counter(), 60)
        first_loss = d.find_element(By.ID, "job-loss").text
        second = wait_until("a later step", lambda: counter() > first + 2 and counter(), 30)
        self.assertGreater(second, first)
        self.assertNotEqual(d.find_element(By.ID, "job-loss").text, "-")
        self.assertNotEqual(first_loss, "-")
        self.assertEqual(self.job_json()["state"], "RUNNING", "the job should still be running")

    def test_3_loss_curve_has_a_point_per_step(self):
        d = self.driver
        # The curve and the counter as one poll drew them (one script, no redraw between).
        points, counter = d.execute_script(
            "const l = document.querySelector('#loss-curve polyline.raw');"
            "return [l ? l.getAttribute('points').trim().split(/\\s+/).length : 0,"
            " Number(document.querySelector('.step-counter').textContent)];")
        job = self.job_json()
        self.assertGreater(points, 0)
        self.assertEqual(points, counter, "a point per step the page says is done")
        # The page is at most a poll behind the API, which has every step it drew.
        self.assertLessEqual(points, len(job["history"]))
        self.assertEqual([int(h["step"]) for h in job["history"][:points]], list(range(1, points + 1)))
        # The smoothed curve has as many points; validation points appear every 25 steps.
        self.assertEqual(polyline_points(d, "#loss-curve polyline.smoothed"), points)

    def test_4_gantt_has_a_row_per_stage(self):
        d = self.driver
        # The page redraws the Gantt on each poll: read it in one script, not element by
        # element (an element found before a redraw is stale after it).
        snapshot = """
            return [...document.querySelectorAll(arguments[0])].map((g) => ({
              stage: g.getAttribute('data-stage'),
              y: g.getBoundingClientRect().top,
              kinds: [...new Set([...g.querySelectorAll('rect')].map((r) => r.getAttribute('class')))],
            }));"""
        rows = wait_until("the Gantt's rows", lambda: d.execute_script(snapshot, "#gantt .row"), 20)
        self.assertEqual(len(rows), 2)
        for row in rows:
            self.assertIn("action kind-F", row["kinds"])
            self.assertIn("action kind-B", row["kinds"])
        # Under the measured rows, the predicted step: a row per stage, the same kinds.
        both = wait_until("the Gantt's predicted rows", lambda: (lambda r: r if len(r) == 4 else None)(
            d.execute_script(snapshot, "#gantt .row, #gantt .row-predicted")), 20)
        measured, predicted = both[:2], both[2:]
        self.assertEqual([r["stage"] for r in predicted], [r["stage"] for r in measured])
        for row, above in zip(predicted, measured):
            self.assertIn("action kind-F", row["kinds"])
            self.assertIn("action kind-B", row["kinds"])
            # Drawn below the measured block, on the same axis.
            self.assertGreater(row["y"], above["y"])
        memory = d.find_elements(By.CSS_SELECTOR, "#memory tbody tr[data-stage]")
        self.assertEqual(len(memory), 2)
        time.sleep(1.5)  # a few more points on the curves for the screenshot
        shot(d, "dashboard-job.png")

    def test_5_a_killed_stage_turns_red(self):
        d = self.driver
        in_job = set(self.job_json()["stage_addresses"])
        spare = [s for s in self.cluster.stages if s.address not in in_job]
        self.assertEqual(len(spare), 1, f"one stage outside the job {in_job}")
        d.get(self.cluster.url + "/")
        row = f"#cluster tr[data-address='{spare[0].address}']"
        wait_until("the spare stage's row", lambda: d.find_elements(By.CSS_SELECTOR, row), 10)
        self.assertNotIn("lost", d.find_element(By.CSS_SELECTOR, row).get_attribute("class"))
        spare[0].stop(signal.SIGKILL)
        start = time.monotonic()
        # The coordinator marks it LOST after the heartbeat timeout; the page polls once
        # a second: allow the timeout, a heartbeat interval and two polls.
        wait_until("the killed stage's red row", lambda: "lost" in d.find_element(
            By.CSS_SELECTOR, row).get_attribute("class"), HEARTBEAT_TIMEOUT_S + 4)
        print(f"stage row red {time.monotonic() - start:.1f} s after SIGKILL", file=sys.stderr)
        self.assertEqual(d.find_element(By.CSS_SELECTOR, row + " .stage-state").text, "LOST")
        shot(d, "dashboard-cluster.png")

    def test_6_curve_matches_the_api_once_done(self):
        d = self.driver
        wait_until("the job's end", lambda: self.job_json()["state"] == "SUCCEEDED", 240)
        d.get(f"{self.cluster.url}/jobs/{self.job}")
        job = self.job_json()
        steps = len(job["history"])
        self.assertEqual(steps, int(job["steps_done"]))
        wait_until(f"{steps} points", lambda: polyline_points(d, "#loss-curve polyline.raw") == steps, 20)
        self.assertEqual(int(d.find_element(By.CSS_SELECTOR, ".step-counter").text), steps)
        vals = sum(1 for h in job["history"] if h.get("has_val_loss"))
        self.assertEqual(polyline_points(d, "#loss-curve polyline.val"), vals)
        # The learning rate: a point per step, and the head shows the last step's (the
        # cosine schedule's min_lr).
        self.assertEqual(polyline_points(d, "#lr-curve polyline.lr"), steps)
        last_lr = job["history"][-1]["lr"]
        self.assertAlmostEqual(last_lr, 0.0003, places=9)
        self.assertEqual(d.find_element(By.ID, "job-lr").text, f"{last_lr:.2e}".replace("e-0", "e-"))
        shot(d, "dashboard-job-done.png")
        # The log-scale toggle redraws the same points, higher up for the small losses.
        linear = d.find_element(By.CSS_SELECTOR, "#loss-curve polyline.raw").get_attribute("points")
        d.find_element(By.ID, "log-scale").click()
        self.assertEqual(polyline_points(d, "#loss-curve polyline.raw"), steps)
        logged = d.find_element(By.CSS_SELECTOR, "#loss-curve polyline.raw").get_attribute("points")
        self.assertNotEqual(linear, logged)
        # Smoothing 0 is the raw curve; the default (0.6) is not.
        points = lambda cls: d.find_element(By.CSS_SELECTOR, f"#loss-curve polyline.{cls}").get_attribute("points")
        self.assertNotEqual(points("smoothed"), points("raw"))
        d.execute_script("const s = document.getElementById('smoothing'); s.value = '0';"
                         "s.dispatchEvent(new Event('input'));")
        self.assertEqual(points("smoothed"), points("raw"))

    def test_6b_chrome_trace_download(self):
        d = self.driver
        wait_until("the Gantt", lambda: d.find_elements(By.CSS_SELECTOR, "#gantt .row"), 20)
        d.find_element(By.ID, "download-trace").click()
        path = os.path.join(self.downloads, f"{self.job}-trace.json")
        wait_until("the downloaded trace", lambda: os.path.exists(path) and os.path.getsize(path) > 0, 20)
        with open(path) as f:
            trace = json.load(f)
        timeline = self.cluster.api(f"/api/jobs/{self.job}/timeline?steps=20")
        actions = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        self.assertEqual(len(actions), len(timeline["events"]))
        names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
        self.assertEqual(names, {"stage 0", "stage 1"})
        # Steps are laid end to end: a step's actions start after the previous one's end.
        self.assertTrue(all(e["ts"] >= 0 and e["dur"] >= 0 for e in actions))
        steps = sorted({e["args"]["step"] for e in actions})
        self.assertGreater(len(steps), 1, "20 steps kept")
        for a, b in zip(steps, steps[1:]):
            end_a = max(e["ts"] + e["dur"] for e in actions if e["args"]["step"] == a)
            start_b = min(e["ts"] for e in actions if e["args"]["step"] == b)
            self.assertGreaterEqual(start_b, end_a, f"step {b} after step {a}")

    def test_7_unknown_job_is_404(self):
        d = self.driver
        d.get(self.cluster.url + "/jobs/job-999999")
        self.assertIn("404", d.find_element(By.TAG_NAME, "h2").text)
        self.assertIn("job-999999", d.page_source)
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(self.cluster.url + "/jobs/job-999999", timeout=10)
        self.assertEqual(e.exception.code, 404)

    def test_8_coordinator_restart_shows_reconnecting(self):
        d = self.driver
        d.get(self.cluster.url + "/")
        status = lambda: d.find_element(By.ID, "conn-status").text
        wait_until("live", lambda: status() == "live", 10)
        self.cluster.coordinator.stop(signal.SIGTERM)
        wait_until("'reconnecting'", lambda: status() == "reconnecting", 10)
        self.cluster.start_coordinator()  # same ports, same state dir
        wait_until("live again", lambda: status() == "live", 20)
        wait_until("the job listed again", lambda: d.find_elements(
            By.CSS_SELECTOR, f"#jobs tr[data-job='{self.job}']"), 10)


class TokenGateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="pipetrain-dashboard-token-")
        cls.token_file = os.path.join(cls.dir, "token")
        with open(cls.token_file, "w") as f:
            f.write("s3cret-dashboard-token\n")
        os.chmod(cls.token_file, 0o600)
        cls.cluster = Cluster(os.path.join(cls.dir, "state"), stages=1, token_file=cls.token_file)
        try:
            cls.job = submit(cls.cluster, write_spec(cls.dir, steps=3, stages=1))
            cls.driver = browser()
        except BaseException:
            cls.cluster.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.driver.quit()
        cls.cluster.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_login_form_then_jobs(self):
        d = self.driver
        d.get(self.cluster.url + "/")
        self.assertTrue(d.find_elements(By.CSS_SELECTOR, "#login form"), "the login form")
        self.assertFalse(d.find_elements(By.CSS_SELECTOR, "#jobs"))
        self.assertNotIn(self.job, d.page_source)
        # A wrong token: the form again, with an error.
        d.find_element(By.ID, "token").send_keys("wrong")
        d.find_element(By.ID, "login-submit").click()
        wait_until("the error", lambda: d.find_elements(By.ID, "login-error"), 10)
        self.assertFalse(d.get_cookies(), "no cookie for a wrong token")
        d.find_element(By.ID, "token").send_keys("s3cret-dashboard-token")
        d.find_element(By.ID, "login-submit").click()
        wait_until("the job's row", lambda: d.find_elements(
            By.CSS_SELECTOR, f"#jobs tr[data-job='{self.job}']"), 20)
        cookie = d.get_cookie("pipetrain_token")
        self.assertTrue(cookie["httpOnly"])
        self.assertEqual(cookie.get("sameSite"), "Strict")
        self.assertNotIn("s3cret", d.current_url)
        # The coordinator never logged the token.
        self.assertNotIn("s3cret", self.cluster.coordinator.log())


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True, help="the build's bin dir")
    parser.add_argument("--artifacts", required=True, help="where screenshots go")
    parser.add_argument("--steps", type=int, default=300, help="the watched job's steps")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
