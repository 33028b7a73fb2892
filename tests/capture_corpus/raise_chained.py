try:
    {}["missing"]
except KeyError as exc:
    raise RuntimeError("wrapped") from exc
