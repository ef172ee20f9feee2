"""What a run may be asked for, in one place: the settings spec (`spec`: each field's type, range and help, the
checks), the command-line options made from it (`options`), the server's limits on every input (`limits`) and the
one-sentence errors a bad input or a fault becomes (`errors`). Below the run paths and the serving machinery, which
both validate against it; it knows no run."""
