"""Data sets and their partitioning: everything between a scenario's ``dataset:`` section and
the tensors the trainers take.

* data sets by name (:mod:`~fedsim.data.datasets`: MNIST, Fashion-MNIST, CIFAR-10, FEMNIST),
  generated ones (``synthetic``), the user's own arrays (:mod:`~fedsim.data.arrays`) and
  factories (:mod:`~fedsim.data.factory_data`);
* where a file is (:mod:`~fedsim.data.locate`: the scenario's ``dataset.path``, then
  ``$FEDSIM_DATA_DIR``, then the user cache), the one resolver the run and ``fedsim data``
  use;
* where each comes from: its sources, one interface (:class:`~fedsim.data.sources.Source`)
  for downloads and local copies, each verified (:mod:`~fedsim.data.sources`), and its
  published file formats (:mod:`~fedsim.data.formats`);
* a scenario's data as tensors (:func:`scenario_data`) and its partitions across client
  groups and clients (:func:`split_groups`).

Above :mod:`fedsim.config` (it reads the ``dataset:`` section) and below
:mod:`fedsim.training` (which takes the arrays or tensors made here).
"""

from fedsim.data.load import ScenarioData, load_dataset, scenario_data
from fedsim.data.partition import partition, split_groups

__all__ = ["ScenarioData", "load_dataset", "partition", "scenario_data", "split_groups"]
