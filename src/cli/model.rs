//! `dptrain model show` and `dptrain model list`.

/// The batch `train` runs at unless told (`--batch`), for the memory line.
const DEFAULT_BATCH: usize = 64;

/// `dptrain model show`: a model's layers, shapes, parameters and costs.
pub(super) fn show(model: &str, input: Option<&str>, classes: Option<usize>) -> Result<(), String> {
    let spec = crate::model::load(model).map_err(|e| e.to_string())?;
    let shape = match input {
        Some(s) => parse_input_shape(s)?,
        None => spec.default_input.unwrap_or([3, 32, 32]),
    };
    let classes = classes.or(spec.default_classes).unwrap_or(10);
    if classes == 0 {
        return Err("--classes must be at least 1".into());
    }
    let g = crate::model::Graph::build(&spec, shape, classes).map_err(|e| e.to_string())?;
    crate::outln!(
        "{} ({}): input {}x{}x{}, {classes} classes{}",
        g.name,
        spec.source,
        shape[0],
        shape[1],
        shape[2],
        if spec.description.is_empty() {
            String::new()
        } else {
            format!("; {}", spec.description)
        }
    );
    crate::out!("{}", crate::model::summary::render(&g));
    // The same estimate `train` checks, for the default batch on one worker.
    let threads = crate::limits::cores();
    let mut inputs = crate::plan::memory::MemoryInputs::training(&g, DEFAULT_BATCH, 1, threads);
    inputs.data_buffers = 3;
    let memory = crate::plan::memory::estimate(&inputs);
    crate::outln!(
        "memory: training at --batch {DEFAULT_BATCH} on 1 worker x {threads} thread(s) needs about {} ({})",
        crate::limits::human_bytes(memory.total()),
        memory.describe()
    );
    Ok(())
}

/// `--input CxHxW`: three positive sizes.
fn parse_input_shape(s: &str) -> Result<[usize; 3], String> {
    let dims: Vec<usize> = s
        .split('x')
        .map(|d| {
            d.trim()
                .parse()
                .map_err(|_| format!("--input {s:?}: expected CxHxW, e.g. 3x32x32"))
        })
        .collect::<Result<_, _>>()?;
    match dims[..] {
        [c, h, w] if c > 0 && h > 0 && w > 0 => Ok([c, h, w]),
        _ => Err(format!(
            "--input {s:?}: expected three positive sizes CxHxW, e.g. 3x32x32"
        )),
    }
}

/// `dptrain model list`: the built-in models and what each is.
pub(super) fn list() -> Result<(), String> {
    for name in crate::model::builtin_names() {
        let spec = crate::model::load(name).map_err(|e| e.to_string())?;
        crate::outln!("{name:<20} {}", spec.description);
    }
    Ok(())
}
