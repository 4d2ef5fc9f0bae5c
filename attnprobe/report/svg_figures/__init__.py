"""The report's SVG renderers of the figures of :mod:`attnprobe.plot`, one module each,
discovered by :func:`~attnprobe.report.figure_svg.registered_svg` (ordered by ``RANK``).

Each module registers ``renderer(table) -> [svg, ...]`` under its figure's name with
:func:`~attnprobe.report.figure_svg.svg_renderer`; ``table`` is what the figure's data
function gives, the same table ``ap.plot.<name>`` draws.
"""
