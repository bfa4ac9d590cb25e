# Stage: the paper's tables (Markdown and LaTeX, beside the paper's numbers) and figures, built
# from the result files; also logged to MLflow. `snakemake --report report/report.html` collects
# the outputs marked report() below, with their captions from pipeline/report/.

from meml.plan.layout import RESULTS as RESULTS_ROOT  # noqa: E402
from meml.plan.layout import replicate_eval, replicates_on_disk  # noqa: E402

# The other runs of this study the report pools: those whose every evaluation is on disk now
# (report.replicates; plan/layout.py says how a replicate counts).
REPLICATES = replicates_on_disk(config, CELLS)

TABLES = (
    ["main", "ablation", "majority_vote", "complementarity", "sparsity", "calibration"]
    + (["teachers"] if WORLD == "real" else [])
    + (["base", "base_samples"] if config["eval"]["base"] else [])
    + (["learning"] if config["eval"]["sft"] else [])
    + (["trl"] if config["trl"]["methods"] else [])
    + (list(grid.EXTRA_TABLES) if config["extras"]["methods"] else [])
    + (["replication"] if REPLICATES else [])
    + (["stages"] if config["report"]["stages"] else [])
)


TRL_CELLS = [c for c in CELLS if c.method in config["trl"]["methods"]]  # trained by trl's GRPOTrainer too
TRL_FIGURES = [f"trl_{c.model}_{c.dataset}_{c.method}_seed{c.seed}" for c in TRL_CELLS]
COMPLEMENTARITY_RUNS = [(m, ds) for m in grid.complementarity_models(config) for ds in DATASETS]
COMPLEMENTARITY = [f"{m}_{ds}" for m, ds in COMPLEMENTARITY_RUNS]  # the report's figure names


rule report:
    input:
        evals=[str(LAYOUT.eval(c)) for c in CELLS],
        curves=[str(LAYOUT.rl(c) / "DONE") for c in CELLS],
        complementarity=[str(LAYOUT.complementarity(m, ds)) for m, ds in COMPLEMENTARITY_RUNS],
        mlflow=rules.mlflow_store.output,
        base=[str(LAYOUT.eval_base(m, ds)) for m in grid.models(config) for ds in DATASETS] if config["eval"]["base"] else [],
        calibration=[str(LAYOUT.calibration(m, ds, v)) for m, ds, v in grid.calibrated(config)],
        sft_evals=[str(LAYOUT.eval_sft(m, ds, v)) for m, ds, v in grid.calibrated(config)] if config["eval"]["sft"] else [],
        trl=[str(LAYOUT.trl(c) / name) for c in TRL_CELLS for name in ("DONE", "eval.json")],
        # the replicates' evaluations (report.replicates, those on disk: REPLICATES): runs of their own
        # profile; no rule here writes them, so a replicate run only in part stops the report with a path
        replicates=[str(replicate_eval(name, c)) for name in REPLICATES for c in CELLS],
        # the runs of this grid whose seeds retrain less (report.stages), made the same way
        stages=[
            str(path)
            for name in config["report"]["stages"].values()
            for c in CELLS
            for path in (Layout.of(config, RESULTS_ROOT / name).eval(c), Layout.of(config, RESULTS_ROOT / name).rl(c) / "DONE")
        ]
        + [  # the pretrain and SFT runs' own SFT models: their DONE files say which base each started from
            str(Layout.of(config, RESULTS_ROOT / config["report"]["stages"][key]).sft(m, ds, run) / "DONE")
            for key in ("pretrain", "sft")
            if key in config["report"]["stages"]
            for m, ds, run in grid.calibrated(config)
        ],
        reference=project_file(config["report"]["reference"]),
        claims=project_file(config["report"]["claims"]),
        teachers=expand(str(LAYOUT.experts("real", "{ds}") / "e{k}.stats.json"), ds=DATASETS, k=ALL_EXPERTS[1:])
        if WORLD == "real"
        else [],
    output:
        tables_md=[
            report(f"{REPORT}/tables/{t}.md", caption=CAPTIONS / f"{t}.rst", category="Tables") for t in TABLES
        ],
        tables_tex=expand(f"{REPORT}/tables/{{t}}.tex", t=TABLES),
        curves=[
            report(f"{REPORT}/figures/reward_curves_{ds}.png", caption=CAPTIONS / "reward_curves.rst", category="Reward curves")
            for ds in DATASETS
        ],
        curves_pdf=expand(f"{REPORT}/figures/reward_curves_{{ds}}.pdf", ds=DATASETS),
        sparsity=[
            report(f"{REPORT}/figures/sparsity_{ds}.png", caption=CAPTIONS / "sparsity.rst", category="Reward sparsity")
            for ds in DATASETS
        ],
        sparsity_pdf=expand(f"{REPORT}/figures/sparsity_{{ds}}.pdf", ds=DATASETS),
        complementarity=[
            report(
                f"{REPORT}/figures/complementarity_{name}.png",
                caption=CAPTIONS / "complementarity.rst",
                category="Expert complementarity",
            )
            for name in COMPLEMENTARITY
        ],
        complementarity_pdf=expand(f"{REPORT}/figures/complementarity_{{name}}.pdf", name=COMPLEMENTARITY),
        trl_figures=[
            report(f"{REPORT}/figures/{name}.png", caption=CAPTIONS / "trl.rst", category="Ours and trl")
            for name in TRL_FIGURES
        ],
        trl_pdf=[f"{REPORT}/figures/{name}.pdf" for name in TRL_FIGURES],
        index=f"{REPORT}/index.md",
    params:
        cfg=cli_config(
            "profile", "world", "models", "grid", "extras", "methods", "reward", "rl", "analysis", "report", "mlflow", "experts",
            "calibration", "eval", "trl", shown=True, replicates=REPLICATES
        ),
        results=str(LAYOUT.root),
        out=REPORT,
    log:
        f"{LOGS}/report.log",
    shell:
        "{MEML} report --results {params.results} --out {params.out} --config-json {params.cfg} {RUN_SETTINGS} > {log} 2>&1"
