//! `bmoe report`: the example sweep with repeats, reported in three formats (the JSON checked
//! against medians recomputed here from the CSV), the best point written back and planned, and
//! bad input refused clearly.
use crate::common;
use std::collections::BTreeMap;

use common::{csv_rows, median, report_group, text, Project};

/// The repository's profiles/ and jobs/ beside the tiny model, the sweep given repeats.
fn sweep_project(warmup: u32, repeat: u32) -> Project {
    let p = Project::new();
    for dir in ["profiles", "jobs"] {
        std::fs::create_dir_all(p.path(dir)).unwrap();
        for e in std::fs::read_dir(common::repo_root().join(dir)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(
                e.path(),
                p.path(&format!("{dir}/{}", e.file_name().to_string_lossy())),
            )
            .unwrap();
        }
    }
    let job = p.read("jobs/sweep-cache.toml").replacen(
        "[overrides]",
        &format!("warmup = {warmup}\nrepeat = {repeat}\n\n[overrides]"),
        1,
    );
    p.write("jobs/sweep-cache.toml", &job);
    p
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn sweep_with_repeats_reports_in_three_formats_and_writes_back_the_best_point() {
    let p = sweep_project(1, 2);
    let o = p.bmoe(&["run", "jobs/sweep-cache.toml", "--quiet", "--run-id", "r1"]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = p.read("runs/sweep-cache.csv");
    let all = csv_rows(&csv);
    let items = p.read("jobs/agent-replay.jsonl").lines().count();
    // Every (point, item) twice, repeat 0 and 1; warmup rows are not written.
    assert_eq!(all.len(), 3 * items * 2, "{csv}");
    let mut keys = std::collections::BTreeSet::new();
    for r in &all {
        assert!(keys.insert((r["point"].clone(), r["item"].clone(), r["repeat"].clone())));
        assert!(r["repeat"] == "0" || r["repeat"] == "1", "{r:?}");
    }

    // Warmup ran unwritten: the first measured row of the largest cache already finds experts
    // resident (a cold session's first row hits nothing).
    let first = all
        .iter()
        .find(|r| r["point"] == "cache_mb=2" && r["repeat"] == "0")
        .unwrap();
    let hit: f64 = first["cache_hit_pct"].parse().unwrap();
    assert!(hit > 0.0, "no warm cache after warmup: {first:?}");

    // --resume after losing the last rows writes back exactly those, with their repeat index.
    let lines: Vec<&str> = csv.lines().collect();
    let keep = lines.len() - 3;
    p.write("runs/sweep-cache.csv", &(lines[..keep].join("\n") + "\n"));
    let o = p.bmoe(&[
        "run",
        "jobs/sweep-cache.toml",
        "--quiet",
        "--resume",
        "--run-id",
        "r1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("3 rows appended"), "{}", text(&o));
    let csv = p.read("runs/sweep-cache.csv");
    let after = csv_rows(&csv);
    assert_eq!(after.len(), all.len());
    let mut again = std::collections::BTreeSet::new();
    for r in &after {
        again.insert((r["point"].clone(), r["item"].clone(), r["repeat"].clone()));
    }
    assert_eq!(again, keys);

    // Markdown on stdout.
    let o = p.bmoe(&["report", "runs/sweep-cache.csv"]);
    assert!(o.status.success(), "{}", text(&o));
    let md = String::from_utf8_lossy(&o.stdout).to_string();
    for want in [
        "| point",
        "cache_mb=0",
        "cache_mb=2",
        "prefill tok/s",
        "agreement vs cache_mb=0",
        // Rows as items x repeats, so repeats do not read as more rows.
        &format!("| {} ({items} items x 2 repeats)", 2 * items),
        // Speed against the reference point (a decide job: decisions a second); the reference
        // itself is 1.00x.
        "decisions/s speed-up vs cache_mb=0",
        "decisions/s",
        "| 1.00x",
        // Accuracy per item, with lm-eval's standard error.
        &format!("(n={items} items)"),
        // Provenance.
        "- runs: r1",
        "- hosts: ",
        "- commits: ",
    ] {
        assert!(md.contains(want), "{want}: {md}");
    }

    // JSON: the medians match the CSV.
    let o = p.bmoe(&["report", "runs/sweep-cache.csv", "-o", "out/report.json"]);
    assert!(o.status.success(), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_str(&p.read("out/report.json")).unwrap();
    let groups = j["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 3);
    for g in groups {
        let point = g["point"].as_str().unwrap();
        let mine: Vec<&BTreeMap<String, String>> =
            after.iter().filter(|r| r["point"] == point).collect();
        assert_eq!(g["rows"].as_u64().unwrap() as usize, mine.len());
        assert_eq!(g["repeats"].as_u64(), Some(2));
        assert_eq!(g["items"].as_u64(), Some(items as u64));
        // Swept values typed: a number, as `cache_mb` beside it.
        assert!(g["params"]["cache_mb"].is_u64(), "{}", g["params"]);
        // Accuracy over items (each item's repeats averaged), with lm-eval's mean_stderr.
        let mut per_item: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for r in &mine {
            per_item
                .entry(r["item"].as_str())
                .or_default()
                .push(if r["correct"] == "true" { 1.0 } else { 0.0 });
        }
        let scores: Vec<f64> = per_item
            .values()
            .map(|v| v.iter().sum::<f64>() / v.len() as f64)
            .collect();
        let n = scores.len() as f64;
        let p_hat = scores.iter().sum::<f64>() / n;
        let var = scores.iter().map(|x| (x - p_hat).powi(2)).sum::<f64>() / (n - 1.0);
        assert_eq!(g["accuracy"]["n"].as_u64(), Some(items as u64), "{g}");
        assert!(close(g["accuracy"]["value"].as_f64().unwrap(), p_hat));
        assert!(close(
            g["accuracy"]["stderr"].as_f64().unwrap(),
            (var / n).sqrt()
        ));
        let col = |r: &BTreeMap<String, String>, c: &str| r[c].parse::<f64>().unwrap();
        let tps = median(mine.iter().map(|r| col(r, "prefill_tps")).collect());
        let got = g["metrics"]["prefill_tps"]["median"].as_f64().unwrap();
        assert!(
            close(tps, got),
            "{point}: prefill_tps median {got}, CSV says {tps}"
        );
        // A decide job's decisions a second: 1 / ttft_s, the call to its scores.
        let dps = median(mine.iter().map(|r| 1.0 / col(r, "ttft_s")).collect());
        let got = g["metrics"]["decisions_per_s"]["median"].as_f64().unwrap();
        assert!(
            close(dps, got),
            "{point}: decisions_per_s median {got}, CSV says {dps}"
        );
        // Tokens the row processed: a decision that reused a prefix prefilled `n_prefilled` of
        // its `n_prompt`.
        let prefilled = |r: &BTreeMap<String, String>| {
            r["n_prefilled"]
                .parse::<f64>()
                .unwrap_or_else(|_| col(r, "n_prompt"))
        };
        let per_tok = median(
            mine.iter()
                .map(|r| col(r, "read_mib") / (prefilled(r) + col(r, "tokens")))
                .collect(),
        );
        let got = g["metrics"]["read_mib_per_token"]["median"]
            .as_f64()
            .unwrap();
        assert!(
            close(per_tok, got),
            "{point}: read/token {got} vs {per_tok}"
        );
        let hits: Vec<f64> = mine
            .iter()
            .map(|r| col(r, "cache_hit_pct"))
            .filter(|v| *v >= 0.0)
            .collect();
        if !hits.is_empty() {
            let got = g["metrics"]["cache_hit_pct"]["median"].as_f64().unwrap();
            assert!(close(median(hits), got), "{point}: cache hit");
        }
        // Greedy decisions do not depend on the cache size: full agreement with cache_mb=0.
        assert_eq!(g["agreement"]["reference"], "cache_mb=0");
        assert_eq!(g["agreement"]["value"].as_f64(), Some(1.0));
    }
    // --best without an objective, on decide rows: decisions a second, the most of them wins
    // (a name ending in `_s`, it had been taken for a time, and the slowest point won).
    let o = p.bmoe(&[
        "report",
        "runs/sweep-cache.csv",
        "--best",
        "-o",
        "out/best-default.json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let b: serde_json::Value = serde_json::from_str(&p.read("out/best-default.json")).unwrap();
    let b = &b["best"][0];
    assert_eq!(b["objective"], "decisions_per_s", "{b}");
    assert_eq!(b["direction"], "max", "{b}");
    let fastest = groups
        .iter()
        .max_by(|a, c| {
            let v = |g: &serde_json::Value| g["metrics"]["decisions_per_s"]["median"].as_f64();
            v(a).partial_cmp(&v(c)).unwrap()
        })
        .unwrap();
    assert_eq!(b["point"], fastest["point"], "{b}");
    // Rows carry peak_rss_mib (schema 2), but no profile RAM was given: no RSS plot, and a note.
    let notes = j["notes"].to_string();
    assert!(notes.contains("no profile RAM known"), "{notes}");
    for g in groups {
        assert!(
            g["metrics"]["peak_rss_mib"]["median"]
                .as_f64()
                .unwrap_or(0.0)
                > 0.0,
            "{g}"
        );
    }

    // HTML: self-contained, four plots (peak RSS drawn, without a RAM line).
    let o = p.bmoe(&["report", "runs/sweep-cache.csv", "-o", "out/report.html"]);
    assert!(o.status.success(), "{}", text(&o));
    let html = p.read("out/report.html");
    assert_eq!(html.matches("<svg").count(), 4, "{html}");
    assert!(html.contains("<meta name=\"bmoe-plots\" content=\"4\">"));
    for banned in ["<script", "<link", "url(", "@import", "@font-face"] {
        assert!(!html.contains(banned), "{banned}");
    }
    for id in ["plot-speed", "plot-prefill", "plot-read"] {
        assert!(html.contains(id), "{id}");
    }
    // The prefill scatter is coloured by point, each point in the legend.
    for point in ["cache_mb=0", "cache_mb=1", "cache_mb=2"] {
        let x = legend_x(&html, &format!("{point} CPU ({} rows)", 2 * items));
        // The legend sits beside the plot (its area ends at x=640), not over the data.
        assert!(x > 640.0, "{point}: legend entry at x={x}");
    }
    // The speed plot's x ticks are the swept integers, not 0.0, 0.2, ...
    assert_eq!(x_ticks(&html, "plot-speed"), ["0", "1", "2"]);
    // With --best the winner is ringed on the plots and highlighted in the table.
    let o = p.bmoe(&[
        "report",
        "runs/sweep-cache.csv",
        "--objective",
        "read_mib_per_token",
        "-o",
        "out/best.html",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let html = p.read("out/best.html");
    assert!(html.contains("best point (--best)"), "{html}");
    assert!(
        html.contains("<tr class=\"best\"><td>cache_mb=2 (best)</td>"),
        "{html}"
    );

    // The best point, written back, checks and shows as its own layer in plan.
    let o = p.bmoe(&[
        "report",
        "runs/sweep-cache.csv",
        "--best",
        "--objective",
        "read_mib_per_token",
        "--require",
        "agreement>=0.99",
        "--write-overrides",
        "best.toml",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let best = &j["best"][0];
    // Reading less per token is better, and the largest cache reads least.
    assert_eq!(best["direction"], "min");
    assert_eq!(best["point"], "cache_mb=2", "{best}");
    assert_eq!(best["others"].as_array().unwrap().len(), 2);
    let overlay = p.read("best.toml");
    assert!(overlay.contains("\ncache_mb = 2\n"), "{overlay}");
    let job = p
        .read("jobs/sweep-cache.toml")
        .replace("[sweep]\ncache_mb = [0, 1, 2]", "")
        .replace("name = \"sweep-cache\"", "name = \"tuned\"");
    p.write("jobs/tuned.toml", &job);
    let o = p.bmoe(&["check", "jobs/tuned.toml", "--overrides", "best.toml"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&["plan", "jobs/tuned.toml", "--overrides", "best.toml"]);
    assert!(o.status.success(), "{}", text(&o));
    let plan = text(&o);
    let line = plan
        .lines()
        .find(|l| l.trim_start().starts_with("cache_mb"))
        .unwrap();
    assert!(
        line.contains(" 2 ") && line.contains("overrides best.toml"),
        "{plan}"
    );
    // A sweep over the same key still sweeps, and says so.
    let o = p.bmoe(&["plan", "jobs/sweep-cache.toml", "--overrides", "best.toml"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("the sweep over cache_mb wins over overrides best.toml"));
}

/// The x of the SVG `<text>` whose content starts with `name` (a legend entry; plotters writes
/// the content on its own line).
fn legend_x(html: &str, name: &str) -> f64 {
    let at = html
        .find(&format!(">\n{name}"))
        .unwrap_or_else(|| panic!("no text {name}"));
    let tag = &html[html[..at].rfind("<text").unwrap()..at];
    let x = tag.split("x=\"").nth(1).unwrap();
    x[..x.find('"').unwrap()].parse().unwrap()
}

/// The numeric x tick labels of one plot (plotters centres them under the axis; the y labels are
/// anchored at their end).
fn x_ticks(html: &str, id: &str) -> Vec<String> {
    let start = html.find(&format!("id=\"{id}\"")).unwrap();
    let fig = &html[start..start + html[start..].find("</figure>").unwrap()];
    fig.split("<text")
        .skip(1)
        .filter(|t| t.contains("text-anchor=\"middle\""))
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..t.find("</text>")?];
            let body = body.trim();
            body.parse::<f64>().ok().map(|_| body.to_string())
        })
        .collect()
}

const HEAD_V1: &str =
    "run_id,job,profile,point,item,cache_mb,n_prompt,prefill_s,prefill_tps,best,schema_version\n";
const HEAD_V2: &str = "schema_version,run_id,job,profile,point,item,cache_mb,n_prompt,prefill_s,prefill_tps,best,peak_rss_mib,correct\n";

/// Two CSVs of different schema versions (columns in another order, some only in the newer).
fn two_versions(p: &Project) {
    let mut a = String::from(HEAD_V1);
    let mut b = String::from(HEAD_V2);
    for (cache, tps, rss) in [(100, 50.0, 5000), (200, 80.0, 6100), (300, 90.0, 7000)] {
        for item in 0..4 {
            let t = tps + item as f64;
            a.push_str(&format!(
                "r1,tune,phone,cache_mb={cache},{item},{cache},100,{},{t},{},1\n",
                100.0 / t,
                item % 2
            ));
            b.push_str(&format!(
                "2,r2,tune,phone,cache_mb={cache},{item},{cache},100,{},{t},{},{},{}\n",
                100.0 / t,
                item % 2,
                rss + item,
                if cache == 300 && item == 0 {
                    "false"
                } else {
                    "true"
                }
            ));
        }
    }
    p.write("a.csv", &a);
    p.write("b.csv", &b);
    p.write(
        "phone.toml",
        "name = \"phone\"\nram_mb = 8192\n[engine]\nthreads = 2\n",
    );
}

#[test]
fn csvs_of_different_schema_versions_are_read_by_name() {
    let p = Project::new();
    two_versions(&p);
    let o = p.bmoe(&[
        "report",
        "a.csv",
        "b.csv",
        "--profile-file",
        "phone.toml",
        "-o",
        "r.json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_str(&p.read("r.json")).unwrap();
    let notes = j["notes"].to_string();
    assert!(notes.contains("different schema versions"), "{notes}");
    assert!(
        notes.contains("a.csv: 1") && notes.contains("b.csv: 2"),
        "{notes}"
    );
    let g = &j["groups"][0];
    assert_eq!(g["rows"], 8);
    // peak RSS only from b.csv's rows, 5000..5003: the point's peak in its one run.
    assert_eq!(g["metrics"]["peak_rss_mib"]["n"], 1);
    assert_eq!(
        g["metrics"]["peak_rss_mib"]["median"].as_f64(),
        Some(5003.0)
    );
    assert_eq!(j["groups"][2]["accuracy"]["value"].as_f64(), Some(0.75));
    assert_eq!(j["profile_ram_mib"]["phone"].as_f64(), Some(8192.0));
    // With peak RSS present, its plot is drawn, with the profile's RAM as a line.
    let o = p.bmoe(&[
        "report",
        "a.csv",
        "b.csv",
        "--profile-file",
        "phone.toml",
        "-o",
        "r.html",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let html = p.read("r.html");
    // Speed, prefill and peak RSS; no read_mib column, so no read plot (and a note says so).
    assert_eq!(html.matches("<svg").count(), 3);
    // RAM known: the headroom (RAM - peak RSS), not RSS under a RAM line 1000 times higher.
    assert!(
        html.contains("plot-headroom") && html.contains("phone (RAM 8192 MiB)"),
        "{html}"
    );
    assert!(!html.contains("plot-rss"));
    assert!(
        html.contains("<th>RAM headroom MiB</th><th>accuracy</th>"),
        "{html}"
    );
    assert!(html.contains("read plot left out: no row measured read_mib_per_token"));

    // --require that a point meets picks it; one that none meets names the closest.
    let o = p.bmoe(&[
        "report",
        "a.csv",
        "b.csv",
        "--objective",
        "prefill_tps",
        "--require",
        "peak_rss_mib<=6500",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("best point for job tune on profile phone: cache_mb=200"),
        "{out}"
    );
    assert!(
        out.contains("lost: cache_mb=300: peak_rss_mib is 7003 (needs peak_rss_mib<=6500)"),
        "{out}"
    );
    assert!(
        out.contains("lost: cache_mb=100: prefill_tps 51.5 vs 81.5"),
        "{out}"
    );
}

/// Runs `bmoe report` expecting failure, nothing written, and every `want` in the message.
fn refused(p: &Project, args: &[&str], want: &[&str]) {
    let mut all = vec!["report"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "out.html"]);
    let o = p.bmoe(&all);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(!t.contains("panicked"), "{t}");
    for w in want {
        assert!(t.contains(w), "{w}: {t}");
    }
    assert!(
        !p.path("out.html").exists(),
        "a refused report wrote its output"
    );
}

#[test]
fn bad_input_is_refused_clearly() {
    let p = Project::new();
    two_versions(&p);
    p.write("empty.csv", "");
    p.write("header-only.csv", HEAD_V1);
    p.write("other.csv", "name,score\nalice,3\n");
    refused(&p, &["empty.csv"], &["empty.csv: empty file"]);
    refused(
        &p,
        &["other.csv"],
        &[
            "other.csv: not a bmoe telemetry CSV",
            "no column job, profile, point, item",
            "name,score",
        ],
    );
    refused(&p, &["missing.csv"], &["missing.csv"]);
    // The cause once, not `No such file ... (os error 2): No such file ... (os error 2)`.
    let o = p.bmoe(&["report", "missing.csv"]);
    assert_eq!(text(&o).matches("(os error 2)").count(), 1, "{}", text(&o));
    // A cell that is not a number refuses the file, naming line, column and value (finding 19).
    let mut lines: Vec<String> = p.read("a.csv").lines().map(String::from).collect();
    let mut cells: Vec<&str> = lines[3].split(',').collect();
    assert!(HEAD_V1.split(',').nth(7) == Some("prefill_s"));
    cells[7] = "banana";
    lines[3] = cells.join(",");
    p.write("bad.csv", &(lines.join("\n") + "\n"));
    refused(
        &p,
        &["bad.csv"],
        &["bad.csv line 4, column prefill_s: \"banana\" is not a number"],
    );
    refused(&p, &["header-only.csv"], &["header but no rows"]);
    refused(
        &p,
        &["empty.csv", "other.csv"],
        &["nothing to report", "empty.csv", "other.csv"],
    );
    refused(
        &p,
        &["a.csv", "--objective", "speed"],
        &["--objective speed: no such metric or column", "prefill_tps"],
    );
    // A near miss gets a suggestion, not every name there is.
    refused(
        &p,
        &["a.csv", "--objective", "prefill_tp"],
        &["--objective prefill_tp: no such metric or column in these CSVs; did you mean prefill_tps"],
    );
    let o = p.bmoe(&["report", "a.csv", "--objective", "prefill_tp"]);
    assert!(!text(&o).contains("n_prompt"), "{}", text(&o));
    refused(
        &p,
        &["a.csv", "b.csv", "--require", "peak_rss_mib<=4000"],
        &[
            "no point meets peak_rss_mib<=4000",
            "the closest is cache_mb=100",
            "peak_rss_mib is 5003",
        ],
    );
    refused(
        &p,
        &["a.csv", "--require", "peak_rss_mib"],
        &["--require", "expected NAME<=N"],
    );
    refused(
        &p,
        &["a.csv", "--reference", "cache_mb=5"],
        &["--reference cache_mb=5", "cache_mb=100"],
    );
    refused(
        &p,
        &["a.csv", "--job", "nope"],
        &["no rows of --job nope", "tune"],
    );
    // A foreign file among good ones is left out with a warning; the report still comes out.
    let o = p.bmoe(&["report", "a.csv", "other.csv"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("warning: left out: other.csv"),
        "{}",
        text(&o)
    );
    // --write-overrides with nothing swept has no values to write.
    let base = HEAD_V1.to_string() + "r1,j,p,base,0,0,10,0.1,100,1,1\n";
    p.write("base.csv", &base);
    let o = p.bmoe(&[
        "report",
        "base.csv",
        "--best",
        "--write-overrides",
        "o.toml",
    ]);
    assert!(!o.status.success());
    assert!(text(&o).contains("nothing was swept"), "{}", text(&o));
    assert!(!p.path("o.toml").exists());
    // A point label that is no layered key (a hand-edited CSV) makes no overlay.
    let odd = HEAD_V1.to_string() + "r1,j,p,colour=red,0,0,10,0.1,100,1,1\n";
    p.write("odd.csv", &odd);
    let o = p.bmoe(&["report", "odd.csv", "--best", "--write-overrides", "o.toml"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("point colour=red does not make a valid overlay"),
        "{}",
        text(&o)
    );
    assert!(!p.path("o.toml").exists());
}

/// The sweep run once (no repeats), its CSV returned.
fn one_sweep(p: &Project) -> String {
    let o = p.bmoe(&["run", "jobs/sweep-cache.toml", "--quiet", "--run-id", "r1"]);
    assert!(o.status.success(), "{}", text(&o));
    p.read("runs/sweep-cache.csv")
}

/// `csv`'s rows again, with `run_id` set to `run` and `col` set to `value`.
fn rows_again(csv: &str, run: &str, col: &str, value: &str) -> String {
    let mut rdr = csv::Reader::from_reader(csv.as_bytes());
    let h: Vec<String> = rdr.headers().unwrap().iter().map(String::from).collect();
    let (ir, ic) = (
        h.iter().position(|c| c == "run_id").unwrap(),
        h.iter().position(|c| c == col).unwrap(),
    );
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    for r in rdr.records() {
        let mut cells: Vec<String> = r.unwrap().iter().map(String::from).collect();
        cells[ir] = run.to_string();
        cells[ic] = value.to_string();
        w.write_record(&cells).unwrap();
    }
    String::from_utf8(w.into_inner().unwrap()).unwrap()
}

#[test]
fn an_objective_nothing_measures_is_named_before_the_requirements() {
    let p = sweep_project(0, 1);
    one_sweep(&p);
    // Decide rows never decode: say so, not "no point meets peak_rss_mib<=6000".
    let o = p.bmoe(&[
        "report",
        "runs/sweep-cache.csv",
        "--best",
        "--objective",
        "decode_tps",
        "--require",
        "peak_rss_mib<=6000",
        "--write-overrides",
        "best.toml",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("--objective decode_tps: no row of job sweep-cache on profile host-cpu decodes (a decide job); try prefill_tps or read_mib_per_token"),
        "{}",
        text(&o)
    );
    assert!(!p.path("best.toml").exists());
    // The README's tuning example works on the job it ships with.
    let readme = std::fs::read_to_string(common::repo_root().join("README.md")).unwrap();
    let line = readme
        .lines()
        .find(|l| l.starts_with("bmoe report runs/sweep-cache.csv --best"))
        .unwrap();
    assert!(line.contains("--objective read_mib_per_token"), "{line}");
    let o = p.bmoe(&[
        "report",
        "runs/sweep-cache.csv",
        "--best",
        "--objective",
        "read_mib_per_token",
        "--require",
        "peak_rss_mib<=6000",
        "--write-overrides",
        "best.toml",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(p.read("best.toml").contains("cache_mb = 2"));
}

#[test]
fn unlike_rows_of_a_point_are_split_and_duplicates_counted_once() {
    let p = sweep_project(0, 1);
    let csv = one_sweep(&p);
    let n = common::data_lines(&csv).len();
    let json = |p: &Project, file: &str| -> serde_json::Value {
        let o = p.bmoe(&["report", file, "--format", "json"]);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };

    // The same sweep again with --set threads=97: its rows make groups of their own.
    p.write(
        "threads.csv",
        &(csv.clone() + &rows_again(&csv, "r2", "threads", "97")),
    );
    let j = json(&p, "threads.csv");
    let groups = j["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 6, "{j}");
    let labels: Vec<&str> = groups
        .iter()
        .map(|g| g["label"].as_str().unwrap())
        .collect();
    assert!(labels.contains(&"cache_mb=0 [threads=97]"), "{labels:?}");
    for g in groups {
        assert_eq!(g["rows"].as_u64().unwrap() as usize, n / 3, "{g}");
        assert_eq!(g["runs"].as_array().unwrap().len(), 1, "{g}");
    }
    assert!(
        j["notes"]
            .to_string()
            .contains("point cache_mb=0 is split into 2 groups: its rows differ in threads"),
        "{}",
        j["notes"]
    );
    let o = p.bmoe(&["report", "threads.csv"]);
    assert!(
        text(&o).contains("| cache_mb=0 [threads=97]"),
        "{}",
        text(&o)
    );

    // Another host: split by host, and the provenance header lists both.
    p.write(
        "hosts.csv",
        &(csv.clone() + &rows_again(&csv, "r3", "host", "phone-lab-7")),
    );
    let j = json(&p, "hosts.csv");
    assert_eq!(j["groups"].as_array().unwrap().len(), 6, "{j}");
    assert!(j["groups"]
        .to_string()
        .contains("cache_mb=2 [host=phone-lab-7]"));
    let prov = &j["provenance"];
    assert_eq!(prov["hosts"].as_array().unwrap().len(), 2, "{prov}");
    assert_eq!(prov["runs"], serde_json::json!(["r1", "r3"]));
    assert!(prov["from"].is_string() && prov["models"][0].to_string().contains("sha256"));

    // The same rows twice (a file given twice, or two runs appending at once): a warning, a
    // note, and each key counted once.
    let o = p.bmoe(&[
        "report",
        "runs/sweep-cache.csv",
        "runs/sweep-cache.csv",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("warning: runs/sweep-cache.csv: {n} row(s) repeat an earlier row's (run, job, profile, point, item, repeat) and are counted once")),
        "{err}"
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(j["notes"].to_string().contains("counted once"));
    for g in j["groups"].as_array().unwrap() {
        assert_eq!(g["rows"].as_u64().unwrap() as usize, n / 3, "{g}");
    }
}

/// A perplexity job swept over a numerics-changing setting: the report prices each point against
/// the reference by perplexity, item by item (`ppl vs <reference> (worst item)`), and
/// `--require ppl_change<=X` filters on it. The reference is 0 against itself.
#[test]
fn a_perplexity_sweep_shows_the_change_against_the_reference() {
    let p = Project::new();
    p.write(
        "jobs/ppl.toml",
        &common::ppl_sweep_job(3, "n_expert_used = [0, 1]"),
    );
    let o = p.bmoe(&["run", "jobs/ppl.toml", "--quiet"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = p.bmoe(&["report", "runs/ppl.csv", "--format", "md"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("ppl vs n_expert_used=0 (worst item)"), "{out}");
    let cell = |point: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("| {point} ")))
            .and_then(|l| l.trim_end_matches('|').rsplit('|').next())
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|| panic!("no row {point}: {out}"))
    };
    assert_eq!(cell("n_expert_used=0"), "+0.000% (+0.000%, n=3)", "{out}");
    let c = cell("n_expert_used=1");
    assert!(c.ends_with("n=3)") && c.contains('%'), "{c}");
    let o = p.bmoe(&[
        "report",
        "runs/ppl.csv",
        "--best",
        "--objective",
        "prefill_tps",
        "--require",
        "ppl_change<=0.000001",
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("n_expert_used=0"), "{out}");
}

#[test]
fn best_names_the_points_it_cannot_be_told_from() {
    let p = Project::new();
    // prefill tok/s over 8 items: cache_mb=100 tight around 100, cache_mb=200 a median of 92.5
    // spread over 30..190 (its interval covers 100), cache_mb=300 tight around 40.
    let tps: [(u32, [f64; 8]); 3] = [
        (100, [97.0, 98.0, 99.0, 100.0, 100.0, 101.0, 102.0, 103.0]),
        (200, [30.0, 50.0, 80.0, 90.0, 95.0, 110.0, 140.0, 190.0]),
        (300, [38.0, 39.0, 39.5, 40.0, 40.0, 40.5, 41.0, 42.0]),
    ];
    let mut csv = String::from(HEAD_V1);
    for (cache, speeds) in tps {
        for (item, t) in speeds.iter().enumerate() {
            csv.push_str(&format!(
                "r1,tune,phone,cache_mb={cache},{item},{cache},100,{},{t},0,1\n",
                100.0 / t
            ));
        }
    }
    p.write("noisy.csv", &csv);
    let o = p.bmoe(&["report", "noisy.csv", "--objective", "prefill_tps"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("best point for job tune on profile phone: cache_mb=100\n"),
        "{out}"
    );
    assert!(
        out.contains("  not distinguishable from: cache_mb=200 (95% intervals of prefill_tps overlap the winner's"),
        "{out}"
    );
    assert!(
        out.contains("lost: cache_mb=200: prefill_tps 92.5 vs 100 (-7.5%); not distinguishable: the 95% intervals overlap"),
        "{out}"
    );
    let lost_300 = out
        .lines()
        .find(|l| l.contains("lost: cache_mb=300"))
        .unwrap_or_default();
    assert!(!lost_300.contains("not distinguishable"), "{out}");
    // The spread point is warned about; the speed-up column carries an interval.
    assert!(
        out.contains("warning: timings are noisy: a speed's p90/p10 is over 3x in 1 of 3 groups (tune/phone/cache_mb=200 prefill_tps 3.5x)"),
        "{out}"
    );
    assert!(out.contains("| 0.93x ["), "{out}");

    let o = p.bmoe(&[
        "report",
        "noisy.csv",
        "--objective",
        "prefill_tps",
        "--format",
        "json",
    ]);
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let b = &j["best"][0];
    assert_eq!(
        b["not_distinguishable_from"],
        serde_json::json!(["cache_mb=200"]),
        "{b}"
    );
    let (lo, hi) = (
        b["interval"]["low"].as_f64().unwrap(),
        b["interval"]["high"].as_f64().unwrap(),
    );
    assert!(lo <= 100.0 && hi >= 100.0 && hi - lo < 6.0, "{b}");
    let g200 = report_group(&j, "point", "cache_mb=200");
    let s = &g200["speedup"];
    assert!(
        s["low"].as_f64().unwrap() < 0.925 && s["high"].as_f64().unwrap() > 0.925,
        "{s}"
    );
    let o = p.bmoe(&[
        "report",
        "noisy.csv",
        "--objective",
        "prefill_tps",
        "--format",
        "html",
    ]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("not distinguishable from: cache_mb=200"));

    // Prefill times of a millisecond are warned about, with the fix.
    let short: String = (0..4)
        .map(|item| format!("r1,tune,phone,cache_mb=100,{item},100,100,0.001,100000,0,1\n"))
        .collect();
    p.write("short.csv", &format!("{HEAD_V1}{short}"));
    let out = text(&p.bmoe(&["report", "short.csv"]));
    assert!(
        out.contains("warning: timings are short: median prefill_s under 5 ms in 1 of 1 groups (tune/phone/cache_mb=100 1.00 ms)"),
        "{out}"
    );
    assert!(out.contains("use longer items"), "{out}");
}
