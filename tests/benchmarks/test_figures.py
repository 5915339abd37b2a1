from benchmarks.figures import spread


def test_spread_is_the_median_and_range_with_decimals_by_size():
    assert spread([0.18, 0.161, 0.158]) == "0.161 (0.158-0.180)"
    assert spread([32.4]) == "32.4 (32.4-32.4)"
    assert spread([12690.2, 11369.5, 12930.1]) == "12690 (11370-12930)"


def test_spread_takes_the_decimals_asked():
    assert spread([23.4, 21.7, 23.0], 1) == "23.0 (21.7-23.4)"
    assert spread([150.25, 149.75], 2) == "150.00 (149.75-150.25)"
