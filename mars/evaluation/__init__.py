"""Measuring a MARS model: teacher-forced draft accuracy and calibration, decoding quality (`evaluate`,
`quality`), the side-by-side benchmark (`bench`), report plots (`plots`), the acceptance lab
(`acceptance_lab`: every mask depth's drafts at every answer position, for the adapter and the bare model;
its built-in prompt sets in `prompt_sets`)."""
