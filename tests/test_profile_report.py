"""The doctor's report: `python -m donate.profile` on three training scripts written from public
tutorials (tests/data: the flax NNX MNIST CNN under `nnx.jit`, a nanoGPT-style flax linen model
with an optax `TrainState` under `jax.jit`, an equinox MLP under `eqx.filter_jit`), its command
line, its verdicts, its pages opened in headless Chromium.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import _browser
import donate
from donate._profile import naming, pages, report

ROOT = str(pathlib.Path(__file__).resolve().parent.parent)
DATA = pathlib.Path(__file__).resolve().parent / "data"
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def said(stderr: str) -> list[str]:
  """The lines of stderr that are not JAX's or XLA's start-up logging."""
  return [ln for ln in stderr.strip().splitlines()
          if not ln.startswith(("WARNING: All log messages", "I0000", "W0000", "E0000"))]


def cli(*args, cwd):
  return subprocess.run([sys.executable, "-m", "donate.profile", *args], cwd=cwd, env=ENV,
                        capture_output=True, text=True, timeout=600)


def test_span_folds_layer_numbers_and_counts_layers():
  scopes = [naming.layer_scope(f"jit(step)/transpose(jvp(GPT))/h_{k}/attn/div") for k in range(4)]
  assert report.span(scopes * 2) == ("h_0..h_3/attn", 4)
  assert report.span(["a/b", "c"]) == ("a/b", 1)


def test_an_array_where_the_function_goes_names_both():
  with pytest.raises(donate.DonationError, match=r"got an array float32\[3\].*jax.jit\(step\), x"):
    donate.memory_profile(jnp.ones(3))


def layers_step(ws, x):
  def loss(ws):
    h = x
    for w in ws:
      h = jnp.tanh(h @ w)
    return jnp.mean(h ** 2)
  return [w - 0.1 * g for w, g in zip(ws, jax.grad(loss)(ws))]


def test_a_verdict_folds_repeated_layers_and_says_whether_it_fits():
  ws = [jnp.ones((256, 256)) * 0.01 for _ in range(4)]
  p = donate.memory_profile(jax.jit(layers_step), ws, jnp.ones((1024, 256)))
  top = report.top_group(p)
  assert top.count >= 3 and str(top).startswith(f"{top.count} x ")
  line = report.verdict(p, "h100")
  assert line.startswith(f"layers_step: peak {donate._base.text.format_bytes(p.peak_bytes)}")
  assert str(p.fits("h100")) in line
  assert "test_profile_report.py:" in str(top)
  assert_groups_keep_lines_apart(p)


def two_lines(x):
  a = jnp.sin(x)
  b = jnp.sin(x + 1)
  return a, b


def test_two_lines_of_one_scope_are_two_groups():
  p = donate.memory_profile(jax.jit(two_lines), jnp.ones(1 << 20))
  assert len({r.source for r in p.by_line()}) == 2
  assert_groups_keep_lines_apart(p)


def assert_groups_keep_lines_apart(p):
  """Each group of the report is one source line's: its bytes by line equal `by_line()`'s."""
  by_line, grouped = {}, {}
  for r in p.by_line():
    key = (os.path.basename(r.source), r.category)
    by_line[key] = by_line.get(key, 0) + r.total_bytes
  for g in report.groups(p):
    if ".py:" in g.where:
      grouped[(g.where, g.category)] = grouped.get((g.where, g.category), 0) + g.total_bytes
  assert grouped == by_line


def dense_step(params, x):
  import flax.linen as nn

  def loss(params):
    h = nn.Dense(512).apply(params, x)  # DENSE-CALL
    return jnp.mean(jnp.tanh(h) ** 2)
  return jax.tree.map(lambda w, g: w - 0.1 * g, params, jax.grad(loss)(params))


def test_a_line_is_the_users_frame_first_and_the_librarys_second():
  nn = pytest.importorskip("flax.linen")
  x = jnp.ones((1024, 512))
  params = nn.Dense(512).init(jax.random.key(0), x)
  p = donate.memory_profile(jax.jit(dense_step), params, x)
  call = next(k for k, ln in enumerate(open(__file__), 1) if "# DENSE-CALL" in ln)
  mine = [e for e in p.at_peak if e.source and e.source.endswith(f"test_profile_report.py:{call}")]
  assert mine and all(e.library.startswith("flax/linen/linear.py:") for e in mine), p.at_peak
  own = [e for e in p.at_peak if e.source and e.source.endswith("test_profile_report.py:" +
                                                                 str(call + 1))]
  assert all(e.library is None for e in own)  # jnp.tanh at the user's line: no library's line
  [row] = [r for r in p.by_line() if r.source.endswith(f":{call}")][:1]
  assert row.library == mine[0].library
  said = str(p)[str(p).index("by source line:"):]
  assert f"test_profile_report.py:{call} (activations)\n{'':16}in {row.library}\n" in said, said
  page = pages.program(p)
  assert f"in <code>{row.library}</code>" in page and f'"{row.library}"' in page  # table, hover
  assert "site-packages" not in page
  # the treemap's blocks are labelled by the file's name; the folders stay in the hover's line
  labels = re.findall(r"<text [^>]*>([^<]*)</text>", page)
  assert any(t.startswith(f"test_profile_report.py:{call}") for t in labels), labels
  assert not any(t.startswith("/") for t in labels), labels
  assert_groups_keep_lines_apart(p)


def broadcast(x):
  return jnp.broadcast_to(x, (1024,))


def iota():
  return jnp.arange(256)


def test_folded_programs_count_the_one_op_ones_by_kind():
  ones = [donate.memory_profile(jax.jit(broadcast), 1.0) for _ in range(3)]
  ones.append(donate.memory_profile(jax.jit(iota)))
  big = donate.memory_profile(jax.jit(layers_step), [jnp.ones((256, 256))] * 2, jnp.ones((64, 256)))
  assert len(ones[0].operations) == 1 and len(big.operations) > 1
  shown, rest = report.ranked(ones + [big], top=10, min_share=0.01)
  assert shown == [big]
  line = report.folded(rest, 0.01)
  assert line.startswith("4 more programs, each under 1% of the largest or past the top (")
  assert line.endswith("together): 4 one-op programs (broadcast x 3, iota)"), line
  mixed = report.folded(rest + [big], 0.01)
  assert mixed.endswith(": 4 one-op programs (broadcast x 3, iota), 1 other (layers_step)")


def test_a_compiled_gives_the_same_plan_whichever_is_asked_first():
  def f(x):
    y = jnp.exp(x)
    return y + y.sum()

  x = jnp.ones(2 ** 20)
  first = donate.jit(f, donate_argnums=0).lower(x).compile()
  plan_first = str(first.plan)
  second = donate.jit(f, donate_argnums=0).lower(x).compile()
  profile = second.memory_profile()
  assert str(second.plan) == plan_first and second.plan.profile is profile
  assert "temporary of reduce_sum at test_profile_report.py:" in plan_first.replace("\n      ", " ")
  assert "is live with it" in plan_first.replace("\n      ", " ")
  assert "donation saved 0 B at the peak (8.0 MiB without it)" in plan_first


@pytest.mark.slow
def test_help_and_errors_write_nothing(tmp_path):
  shown = cli("--help", cwd=tmp_path)
  assert shown.returncode == 0
  for option in ("--out", "--device", "--advice", "--fit", "--compare", "--top", "-m"):
    assert option in shown.stdout
  for args in (["nothere.py"], ["-m", "no_such_module_65"], ["--out", "o", "nothere.py", "-x"]):
    bad = cli(*args, cwd=tmp_path)
    assert bad.returncode == 2 and len(said(bad.stderr)) == 1, bad.stderr
    assert "donate.profile: no" in bad.stderr
  assert os.listdir(tmp_path) == []
  device = cli("--device", "h800", str(DATA / "gpt_linen.py"), cwd=tmp_path)
  assert device.returncode == 2 and "h100" in device.stderr and os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def gpt_runs(tmp_path_factory):
  """The GPT script profiled twice, the second run compared with the first."""
  cwd = tmp_path_factory.mktemp("gpt")
  first = cli("--out", "run1", "--device", "h100", "--advice", str(DATA / "gpt_linen.py"),
              cwd=cwd)
  second = cli("--out", "run2", "--compare", "run1", "--top", "2", str(DATA / "gpt_linen.py"),
               cwd=cwd)
  return cwd, first, second


@pytest.mark.slow
def test_the_gpt_report_has_an_index_verdicts_and_grouped_lines(gpt_runs):
  cwd, run, _ = gpt_runs
  assert run.returncode == 0 and run.stdout.startswith("loss "), run.stderr[-3000:]
  verdict = next(ln for ln in run.stderr.splitlines() if ln.startswith("  train_step: peak"))
  assert "activations (4 layers x " in verdict and "gpt_linen.py:" in verdict
  # The four blocks' line, named by their scopes: attention's, or (jaxlib 0.12.1's schedule) the
  # MLP's, which is the block's own.
  assert re.search(r"\(h_0\.\.h_3(/attn)?\)", verdict) and "fits an H100" in verdict
  folded = re.search(r"\d+ more programs, each under 1% of the largest.*", run.stderr).group(0)
  assert re.search(r": \d+ one-op programs \((broadcast_in_dim|iota) x \d+, ", folded), folded
  index = (cwd / "run1" / "index.html").read_text()
  assert "train_step" in index and "id='verdict'" in index
  [page] = (cwd / "run1").glob("*_train_step.html")
  text = page.read_text()
  assert "4 layers x " in text and "site-packages" not in text.split("<details>")[0]
  record = json.loads(page.with_suffix(".json").read_text())
  assert record["function"] == "train_step" and record["peak_bytes"] > 0


@pytest.mark.slow
def test_advice_figures_are_each_a_compile_the_test_makes(gpt_runs):
  _, run, _ = gpt_runs
  sys.path.insert(0, str(DATA))
  try:
    import gpt_linen
  finally:
    sys.path.remove(str(DATA))
  model = gpt_linen.GPT()
  batch = jnp.zeros((gpt_linen.BATCH, gpt_linen.CONTEXT + 1), jnp.int32)
  params = model.init(jax.random.key(0), batch[:, :-1])["params"]
  state = gpt_linen.train_state.TrainState.create(apply_fn=model.apply, params=params,
                                                  tx=gpt_linen.optax.adamw(1e-3))
  p = donate.memory_profile(gpt_linen.train_step, state, batch)
  expected = report.remedies(p.advice())
  # the remedies the compiles measured, largest saving first (which lead depends on the backend's
  # scheduler: donating `state` on jax 0.10's XLA:CPU, checkpointing the layers on 0.12's)
  assert expected.startswith("measured: ") and " MiB" in expected, expected
  verdict = next(ln for ln in run.stderr.splitlines() if ln.startswith("  train_step: peak"))
  assert verdict.endswith(expected), (verdict, expected)


@pytest.mark.slow
def test_compare_says_what_changed_against_an_earlier_run(gpt_runs):
  _, _, second = gpt_runs
  assert second.returncode == 0, second.stderr[-3000:]
  said = second.stderr[second.stderr.index("against the earlier run:"):]
  assert re.search(r"train_step: peak [\d.]+ \w+, was [\d.]+ \w+ \(unchanged\)", said), said


@pytest.mark.slow
@pytest.mark.parametrize("name, where", [("mnist_nnx", "train_step"),
                                         ("mlp_equinox", "train_step")])
def test_nnx_and_equinox_scripts_get_a_verdict(tmp_path, name, where):
  run = cli("--out", "pages", "--device", "b200", str(DATA / f"{name}.py"), cwd=tmp_path)
  assert run.returncode == 0, run.stderr[-3000:]
  verdict = next(ln for ln in run.stderr.splitlines() if ln.startswith(f"  {where}: peak"))
  assert "fits a B200" in verdict
  assert (tmp_path / "pages" / "index.html").exists()
  assert f"{name}.py:" in verdict  # the user's own line, not the framework's
  if name == "mnist_nnx":  # nnx.jit's leaves by their graph paths, not model.states[0][5]
    [page] = (tmp_path / "pages").glob("*_train_step.html")
    text = page.read_text()
    assert "model.linear1.kernel" in text and "optimizer.opt_state[0].mu.linear1.kernel" in text
    assert "model.states[0]" not in text and "optimizer.states[0]" not in text
    # the step's outputs too: the new value of each leaf by its graph path, not out[14]
    assert re.search(r"donate model\.linear1\.kernel \([^)]*\): model\.linear1\.kernel can", text)
    assert not re.search(r"out\[\d", text), re.findall(r".{60}out\[\d.{20}", text)
  if name == "mlp_equinox":  # eqx.filter_jit's leaves by parameter and field, not dynamic_...
    [page] = (tmp_path / "pages").glob("*_train_step.html")
    text = page.read_text().split("<details><summary>The full text")[0]
    assert "model.hidden.weight" in text and "opt_state[0].mu.hidden.weight" in text
    assert "dynamic_nodonate[" not in text
    # what to write is equinox's keyword, not filter_jit's inner argument
    assert "donate model.hidden.weight (eqx.filter_jit(donate=&quot;all&quot;))" in text
    assert "dynamic_nodonate" not in page.read_text() and "dynamic_donate" not in text
    # the step's outputs as `return model, opt_state, loss` gives them back, not out[6]: each
    # `out[k]` is followed by the user's path in that value (out[0].hidden.weight), or is `loss`
    assert "(eqx.filter_jit(donate=&quot;all&quot;)): out[0].hidden.weight can" in text
    assert "out[1][0].mu.hidden.weight" in text
    positional = [m for m in re.findall(r"out\[\d+\][^<\s\"',]*", text)
                  if not re.match(r"out\[0\]\.|out\[1\]\[(0\]\.|…)|out\[2\]$", m)]
    assert not positional, positional


@pytest.mark.slow
def test_the_fit_option_prints_the_fit(tmp_path):
  """The GPT step fits an H100 as written: the plan says so after the one compile it made."""
  run = cli("--out", "pages", "--fit", "h100", str(DATA / "gpt_linen.py"), cwd=tmp_path)
  assert run.returncode == 0, run.stderr[-3000:]
  plan = re.search(r"train_step: plan to fit [\d.]+ GiB usable on an H100 .*\n"
                   r"  it fits as it is: needs [\d.]+ MiB\n  \(1 compile; FLOPs from", run.stderr)
  assert plan, run.stderr[-3000:]


# The pages in headless Chromium: a probe script added to a copy of each page reports what a
# reader would meet (script errors, the widest element, the verdict, the tooltip of a block).
PROBE = """<script>
window.__errors = [];
addEventListener('error', e => window.__errors.push(String(e.message)));
addEventListener('load', () => {
  const rect = document.querySelector('#treemap rect');
  if (rect) {
    const b = rect.getBoundingClientRect();
    rect.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: b.x + 2,
                                                     clientY: b.y + 2}));
  }
  const tip = document.getElementById('tip');
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({errors: window.__errors,
    width: document.documentElement.scrollWidth,
    verdict: (document.getElementById('verdict') || {}).innerText || '',
    tip: tip ? tip.innerText : null});
  document.body.appendChild(out);
});
</script>"""


def probe(page: pathlib.Path) -> dict:
  copy = page.with_name("probe_" + page.name)
  copy.write_text(page.read_text().replace("<head>", "<head>" + PROBE, 1))
  if not _browser.chromium():
    pytest.skip("no Chromium to open the pages with (apt-get install chromium)")
  done = _browser.run(["--window-size=1280,900", "--virtual-time-budget=3000", "--dump-dom",
                       copy.as_uri()])
  copy.unlink()
  found = re.search(r"<pre id=\"probe\">(.*?)</pre>", done.stdout, re.S)
  assert found, done.stderr[-2000:]
  import html
  return json.loads(html.unescape(found.group(1)))


@pytest.mark.slow
def test_the_pages_in_chromium_show_the_verdict_without_errors(gpt_runs):
  cwd, _, _ = gpt_runs
  index = probe(cwd / "run1" / "index.html")
  assert index["errors"] == [] and index["width"] <= 1280
  assert index["verdict"].startswith("train_step: peak")
  [page] = (cwd / "run1").glob("*_train_step.html")
  seen = probe(page)
  assert seen["errors"] == [] and seen["width"] <= 1280, seen
  assert seen["verdict"].startswith("train_step: peak") and "fits an H100" in seen["verdict"]
  assert "bytes: " in seen["tip"] and "category: " in seen["tip"], seen["tip"]


def host_bytes(stats) -> int:
  """The bytes a compiled program holds in host memory, from its `memory_analysis()`."""
  return (stats.host_argument_size_in_bytes + stats.host_output_size_in_bytes
          - stats.host_alias_size_in_bytes + stats.host_temp_size_in_bytes)


@pytest.mark.slow
@pytest.mark.skipif(not donate.targets.available(), reason="needs the gpu-aot extra")
def test_host_bytes_stand_beside_device_bytes_for_an_offload_on_h100s():
  """The smallest offload step of tests/test_memory_fit.py, compiled for 8 H100s: the profile of
  the step written with the offload policy, and the measured offload remedy of the step without
  it, say their host bytes beside the device's in the text, the verdict and the page."""
  from donate._base.text import format_bytes
  from test_memory_fit import offload_args, offload_step as make

  args = offload_args()
  policy = jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")
  written = make(policy)
  stats = written.lower(*args).compile().memory_analysis()
  p = donate.memory_profile(written, *args)
  host = host_bytes(stats)
  assert p.host_bytes == host > 0
  both = f"peak {format_bytes(p.peak_bytes)} device + {format_bytes(host)} host"
  assert both in str(p) and both in report.verdict(p, "h100") and both in pages.program(p)

  plain = donate.memory_profile(make(None), *args)
  assert plain.host_bytes == 0 and " host" not in report.verdict(plain)
  [offload] = plain.advice(["offload_dot_with_no_batch_dims"])
  assert offload.host_bytes > 0
  said = f"{format_bytes(offload.peak_bytes)} device + {format_bytes(offload.host_bytes)} host"
  assert said in pages.program(plain, "h100", [offload])


def layer_scan(policy):
  """8 layers scanned with no checkpoint (`policy` None), or each body checkpointed with it."""

  def body(h, w):
    return jnp.tanh(jnp.tanh(h @ w) @ w), None

  def loss(ws, x):
    layer = body  # checkpointed as the remedy's `how` says
    if policy is not None:
      layer = jax.checkpoint(body, policy=policy, prevent_cse=False)
    h, _ = jax.lax.scan(layer, x, ws)
    return jnp.mean(h**2)

  return jax.jit(lambda ws, x: ws - 0.1 * jax.grad(loss)(ws, x))


@pytest.mark.slow
@pytest.mark.skipif(not donate.targets.available(), reason="needs the gpu-aot extra")
def test_the_verdict_names_the_host_bytes_of_an_offload_that_lowers_the_peak():
  """The layer scan's matmul outputs (256 MiB) offloaded on 8 H100s: the device peak drops and
  the verdict's measured clause gives the saving and the host bytes, each equal to a compile of
  the step written with the offload policy."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from donate._base.text import format_bytes

  s = NamedSharding(donate.targets.gpu_mesh("h100", 8, ("x",)), P())
  args = (jax.ShapeDtypeStruct((8, 256, 256), jnp.float32, sharding=s),
          jax.ShapeDtypeStruct((8192, 256), jnp.float32, sharding=s))
  p = donate.memory_profile(layer_scan(None), *args)
  [offload] = p.advice(["offload_dot_with_no_batch_dims"])
  assert "jax.checkpoint(body, policy=" in offload.how and "prevent_cse=False" in offload.how
  policy = jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")
  written = layer_scan(policy)
  stats = written.lower(*args).compile().memory_analysis()
  host = host_bytes(stats)
  assert offload.host_bytes == host > 0
  assert offload.peak_bytes == donate.memory_profile(written, *args).peak_bytes < p.peak_bytes
  said = f"-{format_bytes(offload.saving_bytes)} (+{format_bytes(host)} host)"
  assert said in report.verdict(p, "h100", [offload])
  assert " host" not in report.verdict(p, "h100", [])
