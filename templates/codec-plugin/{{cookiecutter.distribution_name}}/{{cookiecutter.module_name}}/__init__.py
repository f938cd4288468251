"""{{ cookiecutter.distribution_name }}: {{ cookiecutter.description | replace('"', "'") }}

The codec registers itself with kvcodec through the ``kvcodec`` entry point; use it by name::

    import kvcodec_sdk
    codec = kvcodec_sdk.create_codec({{ cookiecutter.codec_name | tojson }}, device="cuda")
"""

from .plugin import SPEC

__all__ = ["SPEC"]
__version__ = SPEC.version
