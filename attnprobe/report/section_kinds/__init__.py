"""The kinds of report section, one module each, discovered when :mod:`attnprobe.report` is
imported (:func:`~attnprobe.report.contents.registered_sections`; modules in ``RANK``
order).

A new section is one module here whose ``render(contents)`` is decorated with
:func:`~attnprobe.report.contents.section`; the page shows it, in rank order, whenever it
applies, and the README's list of sections (``make readme``) follows.
"""
