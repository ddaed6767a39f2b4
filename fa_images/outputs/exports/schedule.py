"""``fa-images export github --schedule CRON``: a workflow that follows torch releases on its own.

On its schedule (or by hand) it:

1. refreshes the repository's compat table (``compat refresh``; exit 10 "changed" is no error)
   and plans the matrix on it, so a rule such as ``torch: {newest: 3}`` takes a new release;
2. runs one build job per entry of that plan (a matrix made from the plan's output), each with
   ``build --published``: what the published index and the registry hold already is found up to
   date without a pull, so only the new entries build, push, and leave a wheel;
3. publishes: the new wheels and their ``.metadata`` as assets of a GitHub release (2 GB a file;
   a Pages site holds 1 GB in all), the index (``dist site``: manifest.json and simple/, its links
   on the release) as the ``gh-pages`` branch, and the refreshed table as a pull request.

Its only expressions are the plan's output, the matrix value, the secrets' references and job
results, all written here; every flag that reaches the file is checked against its grammar
(``GithubOptions.check``), as in the other exports.
"""

from __future__ import annotations

import shlex

from ...config.matrix import Matrix
from .github_steps import (
    ARTIFACT_PREFIX,
    DOWNLOAD,
    UPLOAD,
    GithubOptions,
    install_steps,
    login_steps,
    secret,
)

DEFAULT_RELEASE = "wheels"  # the release whose assets are the published wheels
PAGES_BRANCH = "gh-pages"
PR_BRANCH = "fa-images/compat-refresh"  # the refreshed table's pull request
# Both commits the workflow makes, as GitHub's Actions bot.
COMMIT = (
    'git -c user.name="github-actions[bot]" '
    '-c user.email="41898282+github-actions[bot]@users.noreply.github.com" commit'
)
TABLE_ARTIFACT = ARTIFACT_PREFIX + "table"
CHANGES = "compat-changes.json"  # what `compat refresh --json` said: the pull request's body
ENTRIES = "${{ fromJSON(needs.plan.outputs.entries) }}"
# A job's name and its artifact's: the entry id comes from the plan, through the matrix.
ENTRY = "${{ matrix.entry }}"
JOB_INDEX = "${{ strategy.job-index }}"


def _refresh_and_plan(matrix: Matrix, opts: GithubOptions) -> dict:
    table, matrix_file = shlex.quote(opts.table), shlex.quote(opts.matrix_file)
    refresh = (
        "table=()\n"
        f"if [ -f {table} ]; then table=(--table {table}); fi\n"
        "status=0\n"
        f'fa-images compat refresh "${{table[@]}}" --out {table} --json > {CHANGES} || status=$?\n'
        "# 10: the table changed (new releases); anything else but 0 is an error.\n"
        'case $status in 0|10) ;; *) exit "$status" ;; esac\n'
    )
    plan = (
        f"fa-images plan --matrix {matrix_file} --compat {table} --json > plan.json\n"
        'entries=$(python -c \'import json; print(json.dumps([e["id"] for e in json.load(open("plan.json"))]))\')\n'
        'echo "entries=$entries" >> "$GITHUB_OUTPUT"\n'
    )
    return {
        "name": "refresh the table, plan the matrix on it",
        "runs-on": list(opts.merge_runs_on),
        "timeout-minutes": 30,
        "outputs": {"entries": "${{ steps.plan.outputs.entries }}"},
        "steps": [
            *install_steps(opts),
            {"name": "Refresh the compat table from the indexes", "run": refresh},
            {"name": "The matrix's entries on the refreshed table", "id": "plan", "run": plan},
            {
                "name": "Upload the refreshed table",
                "uses": UPLOAD,
                "with": {"name": TABLE_ARTIFACT, "path": f"{opts.table}\n{CHANGES}\n", "if-no-files-found": "error"},
            },
        ],
    }


def _build(matrix: Matrix, opts: GithubOptions) -> dict:
    assert opts.published is not None  # GithubOptions.check: --schedule needs it
    command = [
        "fa-images", "build", "--matrix", opts.matrix_file, "--compat", opts.table,
        "--published", opts.published, "--dist", "dist", "--log-dir", "logs", "--report", "report.json",
    ]  # fmt: skip
    command += ["--push"] if opts.push else []
    steps = [
        *install_steps(opts),
        {"name": "Download the refreshed table", "uses": DOWNLOAD, "with": {"name": TABLE_ARTIFACT}},
        *(login_steps([matrix.image], opts) if opts.push else []),
        {
            "name": "Build what the published index and the registry do not hold, check, push",
            # The entry reaches the command through the environment, not as an expression in it.
            "run": shlex.join(command) + ' --only "$FA_IMAGES_ENTRY"',
        },
        {
            # Only an entry whose every step passed is published: a wheel whose image failed its
            # check is in dist/ too, and must not reach the release.
            "name": "Upload the new wheel and its manifest",
            "uses": UPLOAD,
            "with": {
                "name": f"{ARTIFACT_PREFIX}build-{JOB_INDEX}",
                "path": "dist/*.whl\ndist/manifest.json\n",
                "if-no-files-found": "ignore",  # an entry found up to date leaves no wheel
            },
        },
        {
            "name": "Upload the report and logs",
            "if": "always()",
            "uses": UPLOAD,
            "with": {"name": f"{ARTIFACT_PREFIX}logs-{JOB_INDEX}", "path": "report.json\nlogs/\n"},
        },
    ]
    job = {
        "name": ENTRY,
        "needs": "plan",
        "if": "needs.plan.outputs.entries != '[]'",
        "runs-on": list(opts.runs_on),
        "timeout-minutes": opts.timeout_minutes,
        "strategy": {"fail-fast": False, "matrix": {"entry": ENTRIES}},
        "env": {"FA_IMAGES_ENTRY": ENTRY},
    }
    if opts.push:
        job["permissions"] = {"contents": "read", "packages": "write"}
    job["steps"] = steps
    return job


def _publish(opts: GithubOptions) -> dict:
    assert opts.published is not None
    release = opts.release or DEFAULT_RELEASE
    tag, table, published = shlex.quote(release), shlex.quote(opts.table), shlex.quote(opts.published)
    wheels = (
        "mkdir -p artifacts\n"
        "if ! find artifacts -name '*.whl' | grep -q .; then\n"
        '  echo "no new wheel: nothing to publish"; exit 0\n'
        "fi\n"
        "fa-images dist merge artifacts --dist dist\n"
        f'wheel_url="https://github.com/$GITHUB_REPOSITORY/releases/download/{release}/"\n'
        f'fa-images dist site --dist dist --out site --published {published} --wheel-url "$wheel_url" > uploads.txt\n'
        f'gh release view {tag} >/dev/null 2>&1 || gh release create {tag} --title {tag} --notes "flash-attn wheels"\n'
        "# No --clobber: a published wheel is never replaced under its name.\n"
        f"xargs -r -a uploads.txt gh release upload {tag}\n"
        # One commit, the whole site: it is written from the published index and the new wheels.
        'pages="$RUNNER_TEMP/fa-images-pages"\n'
        'git worktree remove --force "$pages" 2>/dev/null || true\n'
        'git worktree add --detach "$pages"\n'
        'cd "$pages"\n'
        "git checkout --orphan fa-images-pages\n"
        "git rm -rfq .\n"
        'cp -R "$GITHUB_WORKSPACE/site/." .\n'
        "touch .nojekyll\n"
        "git add -A\n"
        f'{COMMIT} -qm "fa-images: the index of the published wheels"\n'
        f"git push --force origin HEAD:{PAGES_BRANCH}\n"
    )
    pull_request = (
        f'if git diff --quiet -- {table} && [ -z "$(git status --porcelain -- {table})" ]; then\n'
        '  echo "the table did not change"; exit 0\n'
        "fi\n"
        # One branch, force-pushed: a pull request left open is updated, not joined by another.
        f'branch="{PR_BRANCH}"\n'
        'git switch -C "$branch"\n'
        f"git add {table}\n"
        f'{COMMIT} -qm "compat: the table refreshed from the indexes"\n'
        'git push --force origin "$branch"\n'
        f"{{ echo '```json'; cat {CHANGES}; echo '```'; }} > pr-body.md\n"
        'if [ -n "$(gh pr list --head "$branch" --state open --json number --jq \'.[].number\')" ]; then\n'
        '  gh pr edit "$branch" --body-file pr-body.md\n'
        "else\n"
        f'  gh pr create --base "$GITHUB_REF_NAME" --head "$branch" --title "compat: new torch releases" '
        "--body-file pr-body.md\n"
        "fi\n"
    )
    steps = [
        *install_steps(opts),
        {"name": "Download the refreshed table", "uses": DOWNLOAD, "with": {"name": TABLE_ARTIFACT}},
        {
            "name": "Download the wheels of every build job",
            "uses": DOWNLOAD,
            "with": {"pattern": ARTIFACT_PREFIX + "build-*", "path": "artifacts"},
        },
        {
            "name": f"Publish: the new wheels to release {release}, the index to {PAGES_BRANCH}",
            "env": {"GH_TOKEN": secret("GITHUB_TOKEN")},
            "run": wheels,
        },
        {
            "name": "A pull request with the refreshed table",
            "env": {"GH_TOKEN": secret("GITHUB_TOKEN")},
            "run": pull_request,
        },
    ]
    return {
        "name": "publish the wheels and the index; propose the table",
        "needs": ["plan", "build"],
        # Publish what did build even when some entries failed (their jobs stay red); not when
        # the plan failed, or the run was cancelled.
        "if": "${{ !cancelled() && needs.plan.result == 'success' }}",
        "runs-on": list(opts.merge_runs_on),
        "timeout-minutes": 60,
        "permissions": {"contents": "write", "pull-requests": "write"},
        "steps": steps,
    }


def workflow(matrix: Matrix, opts: GithubOptions) -> dict:
    assert opts.schedule is not None
    return {
        "name": "flash-attn wheels and images, following torch releases",
        "on": {"schedule": [{"cron": opts.schedule}], "workflow_dispatch": {}},
        "permissions": {"contents": "read"},
        # One publication at a time: each writes the whole index from the one before.
        "concurrency": {"group": "fa-images-publish", "cancel-in-progress": False},
        "jobs": {"plan": _refresh_and_plan(matrix, opts), "build": _build(matrix, opts), "publish": _publish(opts)},
    }
