"""cupyx of the stand-in: only the lazily imported compiled module the recorder must not break."""
