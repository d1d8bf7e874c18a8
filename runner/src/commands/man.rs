//! `bmoe man` and `bmoe completions`: both from the same clap definition as `--help`.
use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs};
use crate::sink::output::{check_output, OutputKind};

/// Runs `bmoe completions`.
pub fn completions(a: CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    // Into memory first: clap_complete panics on a failed write (a closed pipe).
    let mut buf = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "bmoe", &mut buf);
    std::io::Write::write_all(&mut std::io::stdout().lock(), &buf)
        .context("writing the completion script to stdout")
}

/// The man pages, from the same clap definition as `--help`. A file in the folder that is not a
/// man page is replaced only with `force`, and then nothing is written.
pub fn write_man(out: Option<&Path>, force: bool) -> anyhow::Result<()> {
    let cmd = Cli::command();
    let Some(dir) = out else {
        let mut stdout = std::io::stdout().lock();
        clap_mangen::Man::new(cmd)
            .render(&mut stdout)
            .context("writing the man page to stdout")?;
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut pages = vec![("bmoe".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() {
            continue;
        }
        // The file is bmoe-run.1 (as git's pages are); the page itself says `bmoe run`.
        let shown = format!("bmoe {}", sub.get_name());
        pages.push((
            format!("bmoe-{}", sub.get_name()),
            sub.clone().display_name(shown.clone()).bin_name(shown),
        ));
    }
    for (name, _) in &pages {
        check_output(
            &dir.join(format!("{name}.1")),
            &[],
            OutputKind::ManPage,
            "-o",
            force,
        )?;
    }
    for (name, c) in pages {
        let path = dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(c)
            .render(&mut buf)
            .with_context(|| format!("rendering {name}.1"))?;
        std::fs::write(&path, buf).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
