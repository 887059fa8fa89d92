"""
ServingSettings: sampling.DecodeSettings and the fields only serving's decoders read. The
reference decoders (decode.py) take either record and read only DecodeSettings' fields;
serving.exact.decoders sends a setting that needs serving to serving's decoders.
"""

from dataclasses import dataclass, fields

from configurator import check_serving_settings
from sampling import DecodeSettings


@dataclass
class ServingSettings(DecodeSettings):
    adaptive: bool = False  # exact SBD: block size follows accepted drafts, drafted in 1 forward
    min_draft_prob: float = 0.0  # exact SBD: check drafts up to the first one this unsure (0: all)
    compiled: bool = False  # every forward through torch.compile's graphs (serving/batched.py)

    def __post_init__(self):
        super().__post_init__()
        check_serving_settings(self)  # each out-of-range value: one line

    def needs_serving(self):
        """Whether a setting here changes what decodes: the reference decoders cannot serve it."""
        return self.adaptive or self.min_draft_prob > 0 or self.compiled


def serving_settings(settings, **changes):
    """Any DecodeSettings as ServingSettings (the serving fields at their defaults unless changed).
    Serving's entry points take either record through this."""
    if isinstance(settings, ServingSettings) and not changes:
        return settings
    same = {f.name: getattr(settings, f.name) for f in fields(settings)}
    return ServingSettings(**{**same, **changes})
