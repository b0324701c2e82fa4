"""Measuring a MARS model: teacher-forced draft accuracy and calibration, decoding quality (`evaluate`,
`quality`), the side-by-side benchmark (`bench`), report plots (`plots`)."""
