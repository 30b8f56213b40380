"""Every command example a user is shown (:mod:`tests.command_examples`) is run as printed by
the test named here, or this says why no test in CI runs it. A new example fails this test
until it is given one or the other, so none goes unchecked unseen."""

# ruff: noqa: E501  (the examples are quoted whole, as printed)

from __future__ import annotations

from pathlib import Path

from tests.benchmarks.test_long_examples_start import EXAMPLES as LONG_EXAMPLES
from tests.command_examples import all_examples

ROOT = Path(__file__).resolve().parents[1]

CERTS = "tests/dept/test_certificates.py::test_every_example_of_the_help_runs_as_printed_into_a_folder_of_its_own"
MODELS = "tests/dept_cli/test_models.py::test_every_example_of_the_help_runs_as_printed"
PREPARE = "tests/dept_cli/test_prepare.py::test_the_help_examples_run_as_printed"
GATEWAY_AUTH = "tests/dept_cli/test_gateway_auth.py::test_the_examples_run_as_printed"
QUICKSTART = "tests/server_app/test_flwr_runtime.py::test_the_readmes_quickstart_runs_as_printed"
CTRL_C = (
    "tests/server_app/test_stopping.py::test_ctrl_c_mid_round_stops_the_run_and_resume_finishes_it"
)
BACKGROUND = (
    "tests/server_app/test_stopping.py::"
    "test_sigterm_stops_a_run_in_the_background_while_another_finishes_on_its_own_superlink"
)
LOOPBACK = (
    "tests/deploy/test_loopback_script.py::"
    "test_the_loopback_script_runs_a_federation_a_source_joins_and_nothing_is_left"
)
COMPOSE = "tests/deploy/test_compose.py::test_the_compose_federation_builds_runs_and_recovers"
SUPEREXEC = "tests/dept_cli/test_superexec.py::test_the_help_example_runs_flowers_executor_with_the_fork_launcher_first_on_path"
USER_FOLDER = (
    "tests/dept_cli/test_user_folder_examples.py::test_the_examples_on_a_users_files_run_as_printed"
)
PLAIN_FLWR = (
    "tests/server_app/test_plain_flwr_run.py::test_the_docs_plain_flwr_run_trains_every_round"
)
KILLED_WORKER = "tests/server_app/test_flwr_runtime.py::test_a_killed_simulation_worker_stops_the_run_with_its_line_and_resume"
WALKTHROUGH = "tests/deploy/test_walkthrough.py::test_the_two_machine_walkthrough_runs_as_printed (on one machine in namespaces: systemctl a stand-in, the 50-round run stopped after round 1)"
SOURCE_FORMS = (
    "tests/dept/data/test_source_forms.py::test_the_docs_example_makes_and_prepares_every_form"
)

LONG_START = "tests/benchmarks/test_long_examples_start.py::test_a_long_example_starts_as_printed_and_ctrl_c_stops_all_of_it"
STARTED = f"started as printed, stopped at its first round or measured row: {LONG_START}"
STARTED_ON_CORPORA = f"{STARTED} (where ../shared/corpora is: a fresh clone skips it)"

# Why an example is not run by a test in CI, by kind.
LONG = (
    "tests/benchmarks/test_fault_soak.py::test_the_long_soak_as_printed_loses_nothing runs it "
    "where DEPT_LONG_SOAK=1 is set, not in CI (the 100-fault soak takes an hour): the "
    "same options, its folders the test's own, not the shared /tmp/soak"
)
DOCKER = (
    "not in CI: Docker's CLI, and images from Docker Hub (flwr/<role>:1.42.0) that cannot be "
    "pulled here; smoke.sh runs the same compose files on podman, from a base made locally"
)
GPU = "not in CI: needs a GPU (the device check runs it where one is lent)"

RUN_BY: dict[str, str] = {
    # --help examples
    "dept certs ~/dept-certs --name superlink.example.org --supernodes de-novels,ru-chekhov": CERTS,
    "dept certs docker/certs --name superlink --name gateway --name 127.0.0.1 --supernodes node-1": CERTS,
    "dept run": QUICKSTART,
    "dept models": MODELS,
    "dept prepare --node-config \"source='de' path='/data/de'\"": PREPARE,
    "dept export outputs/dept --source synth-greek --out models/synth-greek": QUICKSTART,
    "dept run --help": "tests/dept_cli/test_main.py::test_a_subcommands_help_shows_an_example",
    "dept compare --sources-file benchmarks/corpora.yaml --model tiny": STARTED_ON_CORPORA,
    "dept compare --sources-file my-sources.yaml --methods std-0.3,spec-opt --lrs 0.004 --jobs 4": STARTED,
    'dept compare --sources-file my-sources.yaml --budget bytes -c "keep-inner-optimizer=false"': STARTED,
    "dept cpt --sources-file benchmarks/corpora.yaml --held-out en-shakespeare": STARTED_ON_CORPORA,
    "dept cpt --sources-file my-sources.yaml --held-out de-novels --variant spec --cpt-steps 400": STARTED,
    "dept eval outputs/dept": QUICKSTART,
    "dept eval outputs/dept --source de-novels --tasks my_task --include-path my-tasks/": USER_FOLDER,
    "dept eval outputs/dept --global": BACKGROUND,
    "dept eval outputs/compare/runs/std-0.3-lr0.004": USER_FOLDER,
    "dept export outputs/dept --source de-novels --out models/de-novels": USER_FOLDER,
    "dept export outputs/dept --global --out models/global": BACKGROUND,
    "dept finetune outputs/dept --task tasks/sst2": USER_FOLDER,
    "dept finetune outputs/glob --global --task tasks/stsb --epochs 5": USER_FOLDER,
    "dept finetune outputs/compare/runs/std-0.3-lr0.004 --task tasks/sst2": USER_FOLDER,
    "dept gateway-auth --database ~/dept-state/superlink.db": GATEWAY_AUTH,
    "dept gateway-auth --database=/app/state/superlink.db --listen=0.0.0.0:9301": GATEWAY_AUTH,
    "dept models --seq-len 2048 --vocab-size 50368": MODELS,
    "dept models --untied --json": MODELS,
    "dept prepare": PREPARE,
    "dept prepare -c \"sources-file='my-sources.yaml' variant='spec-opt'\" --source de-novels": PREPARE,
    "dept prepare --node-config \"source='de' path='/data/de' state-dir='/state'\"": PREPARE,
    "dept run -c \"model='gpt2:tiny' variant='glob' compression='int8'\" -c \"seed=1\" --no-stream": STARTED,
    "dept run --resume outputs/spec": CTRL_C,
    "dept superexec --insecure --runtime-api-address 127.0.0.1:9094 --superexec-auth-secret-file superexec.secret": SUPEREXEC,
    # README.md
    "pip install -e . && dept run": QUICKSTART,
    'pip install -e ".[test]" && pytest': "run by CI itself: .ci/run ends with it",
    # docs/deployment.md
    "bash docker/loopback.sh loopback-run": f"{LOOPBACK} (its folder the test's own)",
    "dept certs ~/dept-certs --name superlink.example.org --name localhost --name 127.0.0.1 --supernodes de-novels": WALKTHROUGH,
    "mkdir -p ~/dept-state": WALKTHROUGH,
    "flower-superlink --isolation process --enable-supernode-auth --ssl-ca-certfile ~/dept-certs/ca.crt --ssl-certfile ~/dept-certs/server.pem --ssl-keyfile ~/dept-certs/server.key --host 127.0.0.1 --port 8000 --superexec-auth-secret-file ~/dept-certs/superexec.secret --database ~/dept-state/superlink.db --disable-runtime-dependency-installation &": WALKTHROUGH,
    "DEPT_HOME=~/dept-runs flower-superexec --root-certificates ~/dept-certs/ca.crt --runtime-api-address 127.0.0.1:8000 --superexec-auth-secret-file ~/dept-certs/superexec.secret &": WALKTHROUGH,
    "dept gateway-auth --database ~/dept-state/superlink.db --listen 127.0.0.1:9301 &": WALKTHROUGH,
    "export GATEWAY_LISTEN=8443 SUPERLINK_UPSTREAM=127.0.0.1:8000 SUPERLINK_TLS_NAME=localhost GATEWAY_CERT=/home/me/dept-certs/server.pem GATEWAY_KEY=/home/me/dept-certs/server.key SUPERLINK_CA=/home/me/dept-certs/ca.crt GATEWAY_AUTH=127.0.0.1:9301": WALKTHROUGH,
    "envsubst '${GATEWAY_LISTEN} ${GATEWAY_CERT} ${GATEWAY_KEY} ${SUPERLINK_UPSTREAM} ${SUPERLINK_CA} ${SUPERLINK_TLS_NAME} ${GATEWAY_AUTH}' < docker/gateway.conf.template > /etc/nginx/conf.d/dept-gateway.conf": WALKTHROUGH,
    "nginx -t && systemctl reload nginx": WALKTHROUGH,
    "flwr supernode register ~/dept-certs/supernodes/de-novels.pub server": WALKTHROUGH,
    '(umask 077; python -c "import secrets; print(secrets.token_hex(32))" > superexec.secret)': WALKTHROUGH,
    "flower-supernode --isolation process --superlink superlink.example.org:8443 --root-certificates ca.crt --auth-supernode-private-key de-novels --port 9094 --superexec-auth-secret-file superexec.secret --node-config \"source='de-novels' path='/data/de-novels' vocab-size=4096 state-dir='/var/lib/dept'\" &": WALKTHROUGH,
    "dept superexec --insecure --runtime-api-address 127.0.0.1:9094 --superexec-auth-secret-file superexec.secret &": WALKTHROUGH,
    "flwr run . server --stream --run-config \"model='small' num-server-rounds=50 min-available-nodes=1 output-dir='runs/remote-1'\"": WALKTHROUGH,
    "docker compose -f docker/compose.yml up -d --build": DOCKER,
    "flwr run . local --stream": DOCKER,
    "dept certs docker/certs --name superlink --name gateway --name 127.0.0.1 --name <public host name> --supernodes node-1,node-2,node-3": f"{DOCKER}; smoke.sh makes its certificates the same way",
    "mv docker/certs/ca.key <somewhere offline>": DOCKER,
    "sudo chown 49999:49999 docker/certs/server.key docker/certs/superexec.secret docker/certs/supernodes/node-[123]": DOCKER,
    "docker compose -f docker/compose.yml -f docker/compose.tls.yml up -d --build": DOCKER,
    "flwr supernode register docker/certs/supernodes/node-1.pub docker-tls": DOCKER,
    "docker/smoke.sh": COMPOSE,
    "PYTHON_BASE=localhost/dept-python-base:bookworm SMOKE_OUT=smoke-out docker/smoke.sh": f"{COMPOSE} (its SMOKE_OUT the test's own)",
    # docs/evaluation.md
    'pip install -e ".[eval]"': "run by CI itself: the test extra installs the eval extra",
    "dept finetune outputs/dept --task tasks/sst2 --task tasks/stsb --seeds 3 --epochs 3": USER_FOLDER,
    # docs/findings.md
    "python -m benchmarks.overhead.client_overhead": STARTED_ON_CORPORA,
    "python -m benchmarks.overhead.round_overhead": STARTED_ON_CORPORA,
    "python -m benchmarks.comparison.communication": STARTED_ON_CORPORA,
    "python -m benchmarks.overhead.server_scaling": STARTED,
    "python -m benchmarks.gpu.training": GPU,
    "python -m benchmarks.gpu.check": f"{GPU}; its CPU form: tests/benchmarks/test_gpu_check.py",
    "python -m benchmarks.comparison.compression": STARTED_ON_CORPORA,
    "python -m benchmarks.comparison.poisoning": STARTED,
    "python -m benchmarks.overhead.data_scaling": STARTED,
    "python -m benchmarks.comparison.time_budget": STARTED_ON_CORPORA,
    # docs/outputs.md
    'dept run -c "tensorboard=true"': f"{BACKGROUND} (stopped after round 1, as the test does)",
    "tensorboard --logdir outputs/dept/tensorboard": (
        "tests/server_app/test_tracking.py::test_the_docs_viewer_line_serves_a_runs_scalars"
    ),
    "dept run -c \"wandb-project='dept'\"": "not in CI: W&B online needs an account and the internet",
    "WANDB_MODE=offline dept run -c \"wandb-project='dept'\"": KILLED_WORKER,
    "dept run --resume outputs/dept": KILLED_WORKER,
    # docs/robustness.md
    "python -m benchmarks.soak.fault_soak --work /tmp/soak --rounds 8 --faults 10 --loopback-supernodes --superlink-in-memory": (
        "tests/benchmarks/test_fault_soak.py::test_a_short_soak_of_ten_faults_loses_nothing"
        " (the same options, its folder the test's own)"
    ),
    "python -m benchmarks.soak.fault_soak --work /tmp/soak --rounds 60 --faults 100": LONG,
    # docs/running.md
    "dept run -c \"variant='spec' model='debug'\" -c \"num-server-rounds=2 output-dir='outputs/spec'\"": CTRL_C,
    "export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1": f"{PLAIN_FLWR} (with the next line)",
    "flwr run . --stream --run-config \"variant='spec-opt' num-server-rounds=3 local-steps=30 model='debug' output-dir='$PWD/outputs/flwr'\"": PLAIN_FLWR,
    # docs/sources.md
    "python - <<'PY'": SOURCE_FORMS,
    "cat > my-sources.yaml <<'YAML'": SOURCE_FORMS,
    "dept prepare -c \"sources-file='my-sources.yaml' variant='spec-opt'\"": SOURCE_FORMS,
    "cat > four.yaml <<'YAML'": f"{STARTED_ON_CORPORA} (with the next line: its block runs whole)",
    "dept run -c \"sources-file='four.yaml' variant='spec-opt' model='debug' local-steps=30\"": STARTED_ON_CORPORA,
}


def test_every_example_is_run_by_a_test_or_says_why_not() -> None:
    examples = all_examples()

    unlisted = {c: where for c, where in examples.items() if c not in RUN_BY}
    gone = sorted(set(RUN_BY) - set(examples))
    assert not unlisted, f"examples no test runs (add the test, or the reason): {unlisted}"
    assert not gone, f"listed here, shown nowhere: {gone}"


def test_the_started_examples_are_those_the_start_test_runs() -> None:
    """Each example said to be started is, alone or in the block of one that is."""
    started = {c for c, how in RUN_BY.items() if LONG_START in how}
    assert set(LONG_EXAMPLES) <= started
    scripts = [e.script for e in LONG_EXAMPLES.values()]
    assert all(any(c in s for s in scripts) for c in started - set(LONG_EXAMPLES))


def test_each_named_test_is_there() -> None:
    for example, how in RUN_BY.items():
        for named in (word for word in how.split() if word.startswith("tests/")):
            path, _, name = named.partition("::")
            text = (ROOT / path).read_text()
            assert not name or f"def {name}(" in text, (example, named)
