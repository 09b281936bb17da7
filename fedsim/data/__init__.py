"""Data sets and their partitioning: everything between a scenario's ``dataset:`` section and
the tensors the trainers take.

* data sets by name (:mod:`~fedsim.data.datasets`: MNIST, Fashion-MNIST, CIFAR-10, FEMNIST),
  generated ones (``synthetic``), the user's own arrays (:mod:`~fedsim.data.arrays`) and
  factories (:mod:`~fedsim.data.factory_data`);
* where each comes from: its sources, downloaded, verified and cached
  (:mod:`~fedsim.data.sources`) and its published file formats (:mod:`~fedsim.data.formats`);
* partitions across client groups and clients (:mod:`~fedsim.data.partition`).

Above :mod:`fedsim.config` (it reads the ``dataset:`` section) and below
:mod:`fedsim.training` (which takes the arrays or tensors made here).
"""

from fedsim.data.load import load_dataset, partition

__all__ = ["load_dataset", "partition"]
